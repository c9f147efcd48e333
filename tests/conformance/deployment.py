"""Two deployments side by side on one broker, and the idioms' answers from each.

Bare Celery: ``celery -A tests.conformance.bare_app worker`` (prefork), Celery's Redis result
backend. jobsapp: ``celery -A jobsapp worker`` (prefork) and ``celery -A jobsapp beat`` (the
relay and the reaper) on a journal of their own in Postgres. Each app has queues of its own
on the broker. The programs run in a driver process per app (``driver.py``), both at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.databases import migrated_postgres
from tests.support.env import SESSION, service
from tests.support.procs import BIN, ROOT, launching, ready

CHILDREN = "4"  # enough for the idioms that hold a child while the others run
DRIVER_TIMEOUT = 240


@dataclass(frozen=True)
class Answers:
    celery: Mapping[str, Any]
    jobsapp: Mapping[str, Any]
    logs: str


def _worker(app: str, name: str, queue: str) -> list[str]:
    return [
        str(BIN / "celery"),
        "-A",
        app,
        "worker",
        "--pool=prefork",
        "-c",
        CHILDREN,
        "--without-gossip",
        "--without-mingle",
        "-l",
        "info",
        "-Q",
        f"{queue},{queue}-second",
        "-n",
        f"{name}@%h",
    ]


def _drive(which: str, env: Mapping[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.conformance.driver", which],
        cwd=ROOT,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _answers(proc: subprocess.Popen[str]) -> Mapping[str, Any]:
    out, err = proc.communicate(timeout=DRIVER_TIMEOUT)
    assert proc.returncode == 0, f"driver failed ({proc.returncode}):\n{err[-4000:]}"
    found: Mapping[str, Any] = json.loads(out.strip().splitlines()[-1])
    return found


@contextmanager
def side_by_side(broker: str, broker_url: str, workdir: Path) -> Iterator[Answers]:
    """Start both deployments on ``broker_url``, run every idiom on each, stop them."""
    redis_url = service("JOBSAPP_TEST_REDIS_URL")
    with migrated_postgres(f"jobsapp_conformance_{broker}_{SESSION}") as database_url:
        base = {k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}
        env = {
            **base,
            "PYTHONPATH": str(ROOT),
            "CONFORMANCE_BROKER_URL": broker_url,
            "CONFORMANCE_REDIS_URL": redis_url,
            "JOBSAPP_DATABASE_URL": database_url,
            "JOBSAPP_BROKER_URL": broker_url,
            "JOBSAPP_REDIS_URL": redis_url,
            "JOBSAPP_IMPORTS": "tests.conformance.lifecycle_tasks",
            "JOBSAPP_VAR_DIR": str(workdir / "var"),
            "JOBSAPP_STORAGE_URL": f"file://{workdir / 'storage'}",
        }
        queue = f"conformance-{broker}-{SESSION}"
        bare_env = {**env, "CONFORMANCE_QUEUE": f"{queue}-bare"}
        # The idioms are Celery's with a broker that answers: one silent past the publish
        # bound (2 s) is an outage, whose answers (the relay's) the chaos suite checks. A
        # starved machine must not turn a fast-path publish into one.
        ours_env = {**env, "CONFORMANCE_QUEUE": f"{queue}-ours", "JOBSAPP_PUBLISH_TIMEOUT": "15"}
        with launching(env, workdir) as launcher:
            procs = [
                launcher.start(
                    "bare", _worker("tests.conformance.bare_app", "bare", f"{queue}-bare"), bare_env
                ),
                launcher.start("ours", _worker("jobsapp", "ours", f"{queue}-ours"), ours_env),
                launcher.start(
                    "beat",
                    [
                        str(BIN / "celery"),
                        "-A",
                        "jobsapp",
                        "beat",
                        "-s",
                        str(workdir / "schedule"),
                        "-l",
                        "info",
                    ],
                    ours_env,
                ),
            ]
            ready(*procs, timeout=120)
            drivers = [_drive("bare", bare_env), _drive("ours", ours_env)]
            celery, jobsapp = (_answers(d) for d in drivers)
            logs = "\n".join(f"--- {p.name}\n{p.log()[-6000:]}" for p in procs)
            yield Answers(celery, jobsapp, logs)
