"""Which worker process of the console's /admin/workers page holds a running run."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from jobsapp.monitor.workers import Running, WorkerView, holder_of

T0 = datetime(2026, 12, 7, 11, 0, tzinfo=UTC)


def _worker(pid: int, started: timedelta, *, node: str = "celery@vm") -> WorkerView:
    at = T0 + started
    return WorkerView(
        f"{node}:{pid}", node, "vm", pid, "prefork", 2, ["celery"], at, at, None, silent=False
    )


def _run(worker: str, started: timedelta) -> Running:
    return Running("jobs", uuid.uuid4(), "tests.echo", worker, T0 + started)


def test_a_run_of_a_crashed_worker_stays_with_it_not_with_its_restart_on_the_same_node() -> None:
    # A pool child's pid names the run's worker; the registry knows the main processes.
    crashed, restarted = _worker(100, timedelta(0)), _worker(200, timedelta(minutes=5))
    other = _worker(300, timedelta(0), node="celery@other")
    workers = [crashed, restarted, other]

    assert holder_of(_run("celery@vm:105", timedelta(minutes=1)), workers) is crashed
    assert holder_of(_run("celery@vm:205", timedelta(minutes=6)), workers) is restarted
    assert holder_of(_run("celery@nowhere:1", timedelta(minutes=6)), workers) is None
