"""Workers whose clocks are wrong by a minute, either way, keep the lifecycle's timing.

Each worker is a real ``celery -A jobsapp worker`` under libfaketime (preloaded with the
offset, ``faketime_celery.faketime``), so Python's ``time.time()`` and ``datetime.now()``
in it are off; the database's clock is the one every transition stamps and compares with.
Monotonic clocks stay real (``FAKETIME_DONT_FAKE_MONOTONIC``): faked, they hang every
timed wait (the heartbeat's);
``tests/support/faketime_celery.py`` says why ``time.sleep`` is replaced then.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from jobsapp.celery_app import app
from jobsapp.maintenance import reaper, relay
from tests.support import tasks
from tests.support.env import SESSION
from tests.support.faketime_celery import faketime
from tests.support.journal_view import outbox_rows, run_row, transitions
from tests.support.procs import WORKER_FLAGS, Launcher, Proc, ready, service_env
from tests.support.waiting import eventually

SKEW = 60.0
STALE_AFTER = 3.0
SETTINGS = {
    "JOBSAPP_TEST_NAMESPACE": SESSION,
    "JOBSAPP_HEARTBEAT_INTERVAL": "0.5",
    "JOBSAPP_STALE_AFTER": "6",  # the worker's own deadline, well past the reaper's below
    "JOBSAPP_INLINE_WAIT_MAX": "2",
    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
}


def _skewed_clock(offset: str) -> float:
    """How far libfaketime with ``offset`` moves Python's clock (checked, not assumed)."""
    code = "import time; print(time.time())"
    shown = subprocess.run(
        [*faketime(offset), sys.executable, "-c", code],
        env={**os.environ, **SETTINGS},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return float(shown.stdout) - time.time()


def skewed_env(database_url: str, var: Path) -> dict[str, str]:
    """What a skewed process of this module sees: this session's database and broker."""
    return service_env(
        database_url=database_url,
        broker_url=os.environ["JOBSAPP_BROKER_URL"],
        var_dir=var,
        settings=SETTINGS,
    )


@pytest.fixture(scope="module")
def skewed(
    postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], Proc]]:
    """The one worker on this session's queue, its clock skewed by ``offset``: a worker of
    another offset is stopped first, so the test's messages reach only this one."""
    var = tmp_path_factory.mktemp("skew")
    launcher = Launcher(skewed_env(postgres_url, var), Path(var))
    running: dict[str, Proc] = {}

    def worker(offset: str) -> Proc:
        if offset in running:
            return running[offset]
        for other in running.values():
            other.kill()
        running.clear()
        assert abs(abs(_skewed_clock(offset)) - SKEW) < 5, "faketime does not skew Python"
        queue = app.conf.task_default_queue
        celery = [sys.executable, "-m", "tests.support.faketime_celery", "-A", "jobsapp"]
        argv = [
            *faketime(offset),
            *celery,
            "worker",
            *WORKER_FLAGS,
            "-Q",
            queue,
            "-n",
            f"skew{offset}@%h",
        ]
        running[offset] = launcher.start(f"worker{offset}", argv)
        ready(running[offset])
        return running[offset]

    yield worker
    launcher.kill_all()
    launcher.dump_logs()


def test_a_worker_behind_the_database_claims_a_retry_that_is_due(
    pg: Engine, skewed: Callable[[str], Proc]
) -> None:
    skewed(f"-{SKEW:.0f}s")
    token = f"due-{uuid.uuid4()}"
    # Longer than the inline limit: the row waits in the outbox and the relay publishes it.
    handle = tasks.echo.apply_async((token,), countdown=2.5)
    now_due = relay.RelayConfig(grace=timedelta(0))
    eventually(lambda: relay.run_once(app, pg, now_due)["published"] == 1, timeout=15)
    row = handle.settled(timeout=20)
    assert (row["state"], row["attempts"], tasks.calls(token)) == ("succeeded", 1, 1)


def test_the_reaper_leaves_alone_a_live_worker_whose_clock_is_behind(
    pg: Engine, skewed: Callable[[str], Proc]
) -> None:
    skewed(f"-{SKEW:.0f}s")
    token = f"live-{uuid.uuid4()}"
    handle = tasks.sleepy.apply_async(kwargs={"token": token, "seconds": 2 * STALE_AFTER})
    eventually(lambda: run_row(pg, handle.job_id)["state"] == "running", timeout=20)
    # Past the stale limit since the claim: only the heartbeats keep the run alive now.
    time.sleep(STALE_AFTER + 0.5)
    reaper.run_once(pg, reaper.ReaperConfig(stale_after=timedelta(seconds=STALE_AFTER)))
    row = handle.settled(timeout=20)
    assert (row["state"], row["attempts"]) == ("succeeded", 1)
    assert "reap_requeue" not in transitions(pg, handle.job_id)
    assert tasks.calls(f"{token}:published") == 1


def test_a_worker_ahead_of_the_database_does_not_start_a_retry_early(
    pg: Engine, skewed: Callable[[str], Proc]
) -> None:
    worker = skewed(f"+{SKEW:.0f}s")
    token = f"early-{uuid.uuid4()}"
    handle = tasks.echo.apply_async((token,), countdown=SKEW / 2)
    (message,) = outbox_rows(pg, handle.job_id)
    # An early copy of the delayed message (a producer's retry, an operator's republish).
    app.send_task("tests.echo", kwargs={**message["body"], "outbox_id": message["id"]})
    refused = f"job {handle.job_id} attempt 1: no work"
    eventually(lambda: refused in worker.log() or tasks.calls(token) > 0, timeout=20)
    assert (run_row(pg, handle.job_id)["state"], tasks.calls(token)) == ("queued", 0)


def test_a_producer_behind_the_database_publishes_a_job_to_run_at_once(
    pg: Engine, postgres_url: str, skewed: Callable[[str], Proc], tmp_path: Path
) -> None:
    offset = f"-{SKEW:.0f}s"
    skewed(offset)
    token = f"now-{uuid.uuid4()}"
    # The broker countdown is counted on the producer's clock: due now means no countdown.
    code = (
        "import sys; from jobsapp.celery_app import app; from tests.support import tasks; "
        f"app.conf.task_default_queue = {app.conf.task_default_queue!r}; "
        f"print(tasks.echo.apply_async(({token!r},)).job_id)"
    )
    env = skewed_env(postgres_url, tmp_path)
    made = subprocess.run(
        [*faketime(offset), sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    job_id = uuid.UUID(made.stdout.strip().splitlines()[-1])
    row = eventually(lambda: (r := run_row(pg, job_id))["state"] == "succeeded" and r, timeout=20)
    assert (row["attempts"], tasks.calls(token)) == (1, 1)
