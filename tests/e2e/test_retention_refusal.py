"""Retention refuses to run inside a dedup window, in beat and in the one-off command.

The processes import a task whose dedup window (30 days) outlasts the default retention
of finished runs (7 days). Beat logs the refusal and keeps running; ``jobsapp maintenance
run-once`` runs the other passes and exits 1 with the reason on stderr. A run finished 8
days ago, which the pass would otherwise delete, is still there.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update

from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import OUTBOX
from jobsapp.lifecycle.journal.tables import JobRun
from tests.support import tasks
from tests.support.procs import Launcher, service_env
from tests.support.servers import RedisServer

RUNS = JobRun.__table__
REFUSAL = (
    "finished runs are kept 7 days, but task tests.long_window absorbs repeated "
    "enqueues for 30 days"
)

pytestmark = pytest.mark.timeout(120)


def finished_days_ago(db: Engine, days: float) -> uuid.UUID:
    job = tasks.echo.new_job(("m",), {}, uuid.uuid4())
    now = utcnow()
    with db.begin() as conn:
        journal.enqueue(conn, job, now=now - timedelta(days=days + 1), actor="test")
        finished = now - timedelta(days=days)
        conn.execute(
            update(RUNS)
            .where(RUNS.c.job_id == job.job_id)
            .values(state="succeeded", finished_at=finished)
        )
        conn.execute(
            update(OUTBOX)
            .where(OUTBOX.c.job_id == job.job_id)
            .values(published_at=now, delivered_at=now)
        )
    return job.job_id


def still_there(db: Engine, job_id: uuid.UUID) -> bool:
    with db.connect() as conn:
        found = conn.execute(select(RUNS.c.job_id).where(RUNS.c.job_id == job_id)).first()
    return found is not None


def test_beat_and_the_command_refuse_retention_inside_a_dedup_window(
    pg: Engine, postgres_url: str, module_redis: RedisServer, tmp_path: Path
) -> None:
    old = finished_days_ago(pg, 8)
    # A broker nobody consumes: beat's relay has nothing to send, but must not send it
    # where another suite's worker listens.
    broker = module_redis.url
    imports = {"JOBSAPP_IMPORTS": "tests.support.tasks,tests.support.long_window"}
    env = service_env(
        database_url=postgres_url, broker_url=broker, var_dir=tmp_path / "var", settings=imports
    )
    launcher = Launcher(env, tmp_path)
    try:
        alone = launcher.jobsapp("retention", "maintenance", "run-once", "--pass", "retention")
        assert alone.wait(60) == 1, alone.log()
        assert f"jobsapp: retention refused to run: {REFUSAL}" in alone.log()

        every = launcher.jobsapp("all", "maintenance", "run-once")
        assert every.wait(60) == 1, every.log()
        ran = [
            json.loads(line)["pass"] for line in every.log().splitlines() if line.startswith("{")
        ]
        assert ran == ["reaper", "relay", "staging", "reconcile", "metrics"]

        beat = launcher.beat("beat")
        beat.wait_for_log(r"ERROR.*retention refused: " + REFUSAL.replace(".", r"\."), timeout=60)
        beat.wait_for_log(r"maintenance pass jobsapp\.maintenance\.retention failed")
        assert beat.alive()
        assert still_there(pg, old)
    finally:
        launcher.kill_all()
        launcher.dump_logs()
