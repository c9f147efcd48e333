"""A round of ``tests.echo`` jobs through real processes, each checked to run once."""

from __future__ import annotations

import uuid

from sqlalchemy import Engine

from tests.support.journal_view import run_row
from tests.support.procs import Launcher
from tests.support.servers import RedisServer
from tests.support.waiting import eventually


def echo_round(launcher: Launcher, pg: Engine, counters: RedisServer, jobs: int = 10) -> None:
    """``jobs`` jobs from a producer process, each run once and succeeded."""
    tokens = [uuid.uuid4().hex for _ in range(jobs)]
    sent = launcher.enqueue(*({"task": "tests.echo", "kwargs": {"token": t}} for t in tokens))
    ids = [uuid.UUID(job["job_id"]) for job in sent]
    assert len(ids) == jobs

    def done() -> bool:
        return all(run_row(pg, job_id)["state"] == "succeeded" for job_id in ids)

    eventually(done, timeout=60, interval=0.2)
    # tests.support.tasks.record's counters, as a worker process keeps them.
    with counters.client() as client:
        assert [int(client.get(f"jobsapp-test:calls:{t}") or 0) for t in tokens] == [1] * jobs
