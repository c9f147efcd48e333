"""Runs and rows planted straight into the journal (no worker runs a body), for tests that
start from a state a worker would have left: queued, claimed, failed, succeeded, stale."""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update

from jobsapp.attachments.models import ATTACHMENT_RUNS, ATTACHMENTS, RUNS
from jobsapp.attachments.pipeline import original_key
from jobsapp.attachments.service import accept_upload
from jobsapp.attachments.store import PUBLISHED_PREFIX, staging_key
from jobsapp.attachments.tasks import TASK_NAME as ATTACHMENT_TASK
from jobsapp.attachments.tasks import process_attachment
from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import OUTBOX, NewJob, registry
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.tables import JobRun
from jobsapp.lifecycle.rules.states import Outcome
from jobsapp.monitor import rollup
from jobsapp.storage import ObjectStore
from tests.support import tasks
from tests.support.journal_view import held_by, outbox_rows
from tests.unit import images

JOBS = registry.JOBS
JOB_RUNS = JobRun.__table__
# Old enough for every window, as far as the planted rows go.
LONG_AGO = timedelta(days=30)
PNG = images.solid("PNG", (16, 12))
PNG_SHA = hashlib.sha256(PNG).hexdigest()

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
        attempt = journal.load(conn, spec, job_id).attempts + 1  # type: ignore[union-attr]
        now = utcnow() - timedelta(seconds=heartbeat_ago)
        assert journal.claim(conn, spec, job_id, attempt, worker="w1@host", now=now)
    return attempt


def failed_job(
    db: Engine, spec: RunTable = JOBS, job_id: uuid.UUID | None = None, error: str = ERROR
) -> uuid.UUID:
    """A run claimed and then failed for good (``permanent``) with ``error``."""
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
            error=error,
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


def rolled_up(db: Engine) -> None:
    """One rollup pass with no settling time: what beat's next tick counts (finished runs
    by state among them, journal/finished_counts.py)."""
    rollup.run_once(db, settle=timedelta(0))


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
        conn.execute(update(JOB_RUNS).where(JOB_RUNS.c.job_id == job_id).values(**values))


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


def running_attachment_run(db: Engine, *, heartbeat_age: float) -> tuple[uuid.UUID, uuid.UUID]:
    """An accepted upload whose run a worker claimed and then stopped stamping."""
    accepted = accept_upload(images.solid("PNG"), "a.png", None)
    with db.begin() as conn:
        job_id = (
            conn.execute(RUNS.select().where(RUNS.c.attachment_id == accepted.attachment_id))
            .mappings()
            .one()["job_id"]
        )
        journal.claim(conn, ATTACHMENT_RUNS, job_id, 1, worker="w:1", now=utcnow())
        conn.execute(
            update(RUNS)
            .where(RUNS.c.job_id == job_id)
            .values(heartbeat_at=utcnow() - timedelta(seconds=heartbeat_age))
        )
        conn.execute(
            update(ATTACHMENTS)
            .where(ATTACHMENTS.c.id == accepted.attachment_id)
            .values(state="processing")
        )
    return accepted.attachment_id, job_id


def failed_generic_job(engine: Engine, error: str, *, hours: float = 1.0) -> uuid.UUID:
    """A generic job that exhausted its attempts ``hours`` ago with ``error``."""
    at = utcnow() - timedelta(hours=hours)
    job = tasks.echo.new_job(("m",), {}, uuid.uuid4())
    with engine.begin() as conn:
        journal.enqueue(conn, job, now=at, actor="test")
        assert journal.claim(conn, JOBS, job.job_id, 1, worker="w@h:1", now=at)
        assert journal.fail(
            conn,
            JOBS,
            job.job_id,
            1,
            token=held_by(conn, JOBS, job.job_id),
            outcome=Outcome.EXHAUSTED,
            error=error,
            actor="w@h:1",
            now=at,
        )
    return job.job_id


def plant_ready(
    engine: Engine, store: ObjectStore, count: int, *, data: bytes | None = None
) -> list[uuid.UUID]:
    """Attachments published at version 1 as far as reprocessing cares: the row and the
    original in the store (their v1 variants are not needed to render v2)."""
    data = data or images.solid("PNG", (24, 16))
    digest = hashlib.sha256(data).hexdigest()
    now = utcnow()
    rows = []
    for _ in range(count):
        attachment_id = uuid.uuid4()
        key = original_key(PUBLISHED_PREFIX, attachment_id, "png")
        store.put_if_absent(key, data, digest, "image/png")
        rows.append(
            {
                "id": attachment_id,
                "content_type": "image/png",
                "size": len(data),
                "sha256": digest,
                "width": 24,
                "height": 16,
                "display_name": "planted.png",
                "staging_key": staging_key(attachment_id),
                "original_key": key,
                "state": "ready",
                "published_version": 1,
                "error_code": None,
                "idempotency_key": None,
                "created_at": now,
                "updated_at": now,
            }
        )
    with engine.begin() as conn:
        conn.execute(insert(ATTACHMENTS), rows)
    return sorted(row["id"] for row in rows)


def all_on(engine: Engine, ids: list[uuid.UUID], version: int) -> bool:
    return set(published_versions(engine, ids).values()) == {("ready", version)}


def plant_rows(engine: Engine, count: int) -> list[uuid.UUID]:
    """Attachments published at version 1, rows only (in id order): a backfill reads
    nothing else."""
    now = utcnow()
    ids = sorted(uuid.uuid4() for _ in range(count))
    rows = [
        {
            "id": i,
            "content_type": "image/png",
            "size": 1,
            "sha256": "0" * 64,
            "width": 1,
            "height": 1,
            "display_name": "p.png",
            "staging_key": staging_key(i),
            "state": "ready",
            "original_key": f"attachments/{i}/original.png",
            "published_version": 1,
            "error_code": None,
            "created_at": now,
            "updated_at": now,
        }
        for i in ids
    ]
    with engine.begin() as conn:
        conn.execute(insert(ATTACHMENTS), rows)
    return ids


def stage(store: ObjectStore, attachment_id: uuid.UUID | None = None) -> str:
    key = staging_key(attachment_id or uuid.uuid4())
    store.put_if_absent(key, PNG, PNG_SHA, "image/png")
    return key


def plant(
    db: Engine,
    store: ObjectStore,
    state: str,
    *,
    age: timedelta = LONG_AGO,
    runs: tuple[tuple[int, str], ...] = (),
    original: bool = True,
) -> str:
    """An attachment in ``state``, last updated ``age`` ago, with its staging object and
    runs ``(version, run state)``; a ready one has its original published unless not."""
    attachment_id = uuid.uuid4()
    key = stage(store, attachment_id)
    published = original_key(PUBLISHED_PREFIX, attachment_id, "png")
    ready = state == "ready"
    if ready and original:
        store.put_if_absent(published, PNG, PNG_SHA, "image/png")
    then = utcnow() - age
    with db.begin() as conn:
        conn.execute(
            insert(ATTACHMENTS).values(
                id=attachment_id,
                content_type="image/png",
                size=len(PNG),
                sha256=PNG_SHA,
                width=16,
                height=12,
                display_name="p.png",
                staging_key=key,
                original_key=published if ready else None,
                state=state,
                published_version=1 if ready else None,
                created_at=then,
                updated_at=then,
            )
        )
        for version, run_state in runs:
            _plant_run(conn, attachment_id, version, run_state)
    return key


def one_job_run(conn: Connection) -> uuid.UUID:
    job = echo_job()
    assert journal.enqueue_new(conn, job, actor="test") is not None
    run = journal.claim(conn, JOBS, job.job_id, 1, worker="w:1")
    assert run is not None
    assert journal.succeed(conn, JOBS, job.job_id, 1, token=run.claimed_token, actor="w:1")
    return job.job_id


def _plant_run(conn: Connection, attachment_id: uuid.UUID, version: int, state: str) -> None:
    job = process_attachment.new_job(
        (), {"attachment_id": attachment_id, "pipeline_version": version}, None
    )
    now, spec = utcnow(), ATTACHMENT_RUNS
    journal.enqueue(conn, job, now=now, actor="test")
    if state == "queued":
        return
    journal.claim(conn, spec, job.job_id, 1, worker="gone@host:1", now=now)
    if state == "failed":
        journal.fail(
            conn,
            spec,
            job.job_id,
            1,
            token=held_by(conn, spec, job.job_id),
            outcome=Outcome.PERMANENT,
            error="x",
            actor="test",
            now=now,
        )
    elif state == "succeeded":
        journal.succeed(
            conn, spec, job.job_id, 1, token=held_by(conn, spec, job.job_id), actor="test", now=now
        )


def echo_job() -> NewJob:
    return NewJob(
        spec=JOBS,
        job_id=uuid.uuid4(),
        task_name="tests.echo",
        concurrency_key=f"prep:{uuid.uuid4()}",
        max_attempts=2,
        values={"params": {}},
    )


def published_versions(engine: Engine, ids: list[uuid.UUID]) -> dict[uuid.UUID, tuple[str, int]]:
    stmt = select(ATTACHMENTS.c.id, ATTACHMENTS.c.state, ATTACHMENTS.c.published_version).where(
        ATTACHMENTS.c.id.in_(ids)
    )
    with engine.connect() as conn:
        return {r.id: (r.state, r.published_version) for r in conn.execute(stmt)}
