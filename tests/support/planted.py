"""Runs and rows planted straight into the journal (no worker runs a body), for tests that
start from a state a worker would have left: queued, claimed, failed, succeeded, stale."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, insert, update

from jobsapp.attachments.models import ATTACHMENT_RUNS, ATTACHMENTS
from jobsapp.attachments.tasks import TASK_NAME as ATTACHMENT_TASK
from jobsapp.db import utcnow
from jobsapp.lifecycle import journal, registry
from jobsapp.lifecycle.journal import OUTBOX, NewJob
from jobsapp.lifecycle.registry import RunTable
from jobsapp.lifecycle.states import Outcome
from jobsapp.lifecycle.tables import JobRun
from tests.support import tasks
from tests.support.journal_view import held_by, outbox_rows

JOBS = registry.JOBS
RUNS = JobRun.__table__

ERROR = "ValueError: this never works\n  File 'task.py', line 3\n[steps] fetch=1 render=0"


def _queued(
    db: Engine,
    spec: RunTable,
    values: Mapping[str, Any],
    *,
    task: str,
    key: str | None = None,
    ago: float = 0.0,
) -> uuid.UUID:
    job = NewJob(
        spec=spec,
        job_id=uuid.uuid4(),
        task_name=task,
        max_attempts=2,
        concurrency_key=key or f"key:{uuid.uuid4()}",
        values=values,
    )
    with db.begin() as conn:
        journal.enqueue(conn, job, now=utcnow() - timedelta(seconds=ago), actor="producer")
    return job.job_id


def queued_job(db: Engine, *, key: str | None = None, ago: float = 0.0) -> uuid.UUID:
    params = {"params": {"args": ["t"], "kwargs": {}}}
    return _queued(db, JOBS, params, task="tests.doomed", key=key, ago=ago)


def queued_attachment_job(db: Engine, attachment_state: str = "queued") -> uuid.UUID:
    attachment_id, now = uuid.uuid4(), utcnow()
    with db.begin() as conn:
        conn.execute(
            insert(ATTACHMENTS).values(
                id=attachment_id,
                content_type="image/png",
                size=10,
                sha256="0" * 64,
                width=1,
                height=1,
                display_name="a.png",
                staging_key=f"staging/{attachment_id}",
                state=attachment_state,
                created_at=now,
                updated_at=now,
            )
        )
    ids = {"attachment_id": attachment_id, "pipeline_version": 1}
    return _queued(db, ATTACHMENT_RUNS, ids, task=ATTACHMENT_TASK)


def claimed(db: Engine, spec: RunTable, job_id: uuid.UUID, *, heartbeat_ago: float = 0.0) -> int:
    """A worker claims the next attempt (its heartbeat ``heartbeat_ago`` seconds old)."""
    with db.begin() as conn:
        attempt = int(journal.load(conn, spec, job_id)["attempts"]) + 1  # type: ignore[index]
        now = utcnow() - timedelta(seconds=heartbeat_ago)
        assert journal.claim(conn, spec, job_id, attempt, worker="w1@host", now=now)
    return attempt


def failed_job(db: Engine, spec: RunTable = JOBS, job_id: uuid.UUID | None = None) -> uuid.UUID:
    job_id = job_id or queued_job(db)
    attempt = claimed(db, spec, job_id)
    with db.begin() as conn:
        assert journal.fail(
            conn,
            spec,
            job_id,
            attempt,
            token=held_by(conn, spec, job_id),
            outcome=Outcome.PERMANENT,
            error=ERROR,
            actor="w1@host",
            now=utcnow(),
        )
    return job_id


def succeeded_job(db: Engine) -> uuid.UUID:
    job_id = queued_job(db)
    attempt = claimed(db, JOBS, job_id)
    with db.begin() as conn:
        assert journal.succeed(
            conn,
            JOBS,
            job_id,
            attempt,
            token=held_by(conn, JOBS, job_id),
            actor="w1@host",
            now=utcnow(),
        )
    return job_id


def ago(seconds: float) -> datetime:
    return utcnow() - timedelta(seconds=seconds)


def enqueue(db: Engine, *, at: datetime, max_attempts: int | None = None) -> uuid.UUID:
    job = tasks.echo.new_job(("m",), {}, uuid.uuid4())
    if max_attempts is not None:
        job = dataclasses.replace(job, max_attempts=max_attempts)
    with db.begin() as conn:
        journal.enqueue(conn, job, now=at, actor="test")
    return job.job_id


def start(db: Engine, *, at: datetime, attempt: int = 1, **kw: Any) -> uuid.UUID:
    """A run claimed at ``at`` (its message published and taken) whose heartbeat then stopped."""
    job_id = enqueue(db, at=at, **kw)
    with db.begin() as conn:
        assert journal.claim(conn, JOBS, job_id, attempt, worker="w@h:1", now=at) is not None
    set_outbox(db, job_id, 1, published_at=at, publish_count=1, delivered_at=at)
    return job_id


def set_row(db: Engine, job_id: uuid.UUID, **values: Any) -> None:
    with db.begin() as conn:
        conn.execute(update(RUNS).where(RUNS.c.job_id == job_id).values(**values))


def set_outbox(db: Engine, job_id: uuid.UUID, attempt: int, **values: Any) -> None:
    with db.begin() as conn:
        conn.execute(
            update(OUTBOX)
            .where(OUTBOX.c.job_id == job_id, OUTBOX.c.attempt == attempt)
            .values(**values)
        )


def poisoned(db: Engine, job_id: uuid.UUID, **values: Any) -> dict[str, Any]:
    """Make the row's stored body one that no longer validates (a deploy changed the
    schema); returns the body it had."""
    (row,) = outbox_rows(db, job_id)
    body = dict(row["body"])
    set_outbox(db, job_id, 1, body={**body, "attempt": "first"}, **values)
    return body
