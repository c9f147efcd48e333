"""Where a lifecycle job's CPU goes: ``python -m bench profile [--quick] [--ref REF ...]``.

For each tree (this checkout, or each ``--ref`` checked out with ``git worktree`` for the
run), on the bench's fsync-on Postgres and its Redis: a producer sends ``.delay()`` of
the no-op lifecycle job, N timed and N under cProfile, then a solo-pool worker drains
them the same way (``bench/profiling.py``). Writes, per tree and side, the profile text
(``profile-<tree>-<side>.txt``: top entries by cumulative time, and each package's share
of the self time: jobsapp's own code vs Celery, kombu, redis, SQLAlchemy, psycopg2 ...)
and returns the CPU ms per job of each, e.g. ``profile worker CPU ms/job (19f2d6c): X``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psycopg2
import redis

from bench.services import ROOT, Instance, Services

SCRIPT = Path(__file__).with_name("profiling.py")
SIZES = {"full": 2000, "quick": 150, "smoke": 10}  # jobs timed, and as many profiled
# Redis databases of this benchmark's broker, dedup keys and done counter.
BROKER_DB, DEDUP_DB, COUNTER_DB = 10, 11, 12
HERE = "here"


@contextmanager
def tree(ref: str | None) -> Iterator[Path]:
    """This checkout, or ``ref`` checked out beside it for the run."""
    if ref is None:
        yield ROOT
        return
    place = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    path = place / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref],
        check=True,
        capture_output=True,
    )
    try:
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(place, ignore_errors=True)


def fresh_database(instance: Instance, name: str) -> None:
    conn = psycopg2.connect(instance.pg_dsn("postgres"))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()


def environment(instance: Instance, source: Path, database: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")},
        "PYTHONPATH": str(source),
        "JOBSAPP_DATABASE_URL": instance.pg_url(database),
        "JOBSAPP_BROKER_URL": instance.redis_url(BROKER_DB),
        "JOBSAPP_STORAGE_URL": f"file://{source}/var/bench/storage",
        "JOBSAPP_REDIS_URL": instance.redis_url(DEDUP_DB),
        "JOBSAPP_IMPORTS": "bench.lifecycle_tasks",
        "BENCH_COUNTER_URL": instance.redis_url(COUNTER_DB),
    }


def side(name: str, n: int, env: dict[str, str], source: Path, out: Path) -> float:
    """Run one profiled side; its CPU ms per job (the text goes to ``out``)."""
    run = subprocess.run(
        [sys.executable, str(SCRIPT), name, str(n), str(out)],
        env=env,
        cwd=source,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if run.returncode != 0:
        raise RuntimeError(f"profile {name} failed ({run.returncode}):\n{run.stderr[-3000:]}")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    shares = ", ".join(f"{k} {v:.0%}" for k, v in result["shares"].items() if v >= 0.005)
    print(f"{name:<8} CPU {result['cpu_ms']:6.2f} ms/job  self time: {shares}", flush=True)
    return float(result["cpu_ms"])


def profile(instance: Instance, ref: str | None, n: int, out: Path) -> list[str]:
    label = ref or HERE
    with tree(ref) as source:
        database = "profile_" + "".join(c if c.isalnum() else "_" for c in label)
        fresh_database(instance, database)
        env = environment(instance, source, database)
        subprocess.run(
            [sys.executable, "-m", "jobsapp.cli", "db", "upgrade"],
            env=env,
            cwd=source,
            check=True,
            capture_output=True,
        )
        for db in (BROKER_DB, DEDUP_DB, COUNTER_DB):
            redis.Redis.from_url(instance.redis_url(db)).flushdb()
        print(f"-- {label} ({source})", flush=True)
        return [
            f"profile {name} CPU ms/job ({label}): "
            f"{side(name, n, env, source, out / f'profile-{label}-{name}.txt'):.2f}"
            for name in ("producer", "worker")
        ]


def main(services: Services, size: str, out: Path, refs: Sequence[str] = ()) -> list[str]:
    """Profiles this checkout, or each of ``refs``; returns the CPU lines."""
    lines: list[str] = []
    wanted: list[str | None] = [*refs] or [None]
    for ref in wanted:
        lines += profile(services.durable, ref, SIZES[size], out)
    print("\n".join(lines))
    return lines
