"""The producer's path: journal row + outbox row in one transaction, publish after COMMIT.

A caller's ORM ``Session`` is joined and its messages are published by an after-commit
hook (dropped on rollback). A caller's Core ``Connection`` is joined too, but Core has no
after-commit hook: its messages are published by the relay in beat.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

from celery import Celery
from sqlalchemy import Connection, event
from sqlalchemy.orm import Session

from jobsapp import crashpoints
from jobsapp.db import autocommit, get_engine, utcnow
from jobsapp.lifecycle import dedup, journal, outbox
from jobsapp.lifecycle.handle import JobHandle
from jobsapp.lifecycle.journal import EnqueueOutcome, EnqueueResult, NewJob
from jobsapp.settings import get_settings

log = logging.getLogger(__name__)

_PENDING = "jobsapp_pending_messages"


def enqueue(
    app: Celery,
    job: NewJob,
    *,
    session: Session | None = None,
    connection: Connection | None = None,
) -> JobHandle:
    if dedup.seen_recently(job):
        return JobHandle(job.job_id, EnqueueOutcome.DUPLICATE, job.spec)
    if session is not None:
        result = _in_session(session, job)
    elif connection is not None:
        result = journal.enqueue(connection, job, actor="producer")
    else:
        result = _own_transaction(app, job)
    return JobHandle(result.job_id, result.outcome, job.spec, holder=result.holder)


class Batch:
    """Enqueues that join one transaction with the caller's own writes; see ``transaction``."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._done: list[tuple[NewJob, EnqueueResult]] = []

    def add(self, job: NewJob) -> JobHandle:
        result = journal.enqueue(self.conn, job, actor="producer")
        self._done.append((job, result))
        return JobHandle(result.job_id, result.outcome, job.spec, holder=result.holder)

    def publish(self, app: Celery) -> None:
        _after_commit(app, self._done)


@contextmanager
def transaction(app: Celery) -> Iterator[Batch]:
    """One transaction for the caller's rows and any number of enqueues; publish after COMMIT.

    ``with transaction(app) as batch: batch.conn.execute(...); task.enqueue_in(batch, ...)``
    """
    with get_engine().begin() as conn:
        batch = Batch(conn)
        yield batch
    batch.publish(app)


def _own_transaction(app: Celery, job: NewJob) -> EnqueueResult:
    engine = get_engine()
    with autocommit(engine) as conn:
        result = journal.enqueue_new(conn, job, actor="producer")
    if result is None:
        # Taken job_id or key: the answer (and a rerun's several writes) needs a transaction.
        with engine.begin() as conn:
            result = journal.enqueue_existing(conn, job, actor="producer")
    _after_commit(app, [(job, result)])
    return result


def _after_commit(app: Celery, done: Sequence[tuple[NewJob, EnqueueResult]]) -> None:
    """Publish what a committed transaction enqueued (one mark for all of it)."""
    crashpoints.hit("after_commit_before_publish")
    # A delayed start within the short-wait limit rides a countdown; longer ones wait in
    # the outbox for the relay (a long broker ETA is redelivered on Redis, and run twice).
    horizon = timedelta(seconds=get_settings().inline_wait_max)
    messages = [
        replace(journal.on_local_clock(result.message, _due_in(job)), priority=job.priority)
        for job, result in done
        if result.message is not None and _due_in(job) <= horizon
    ]
    if messages:
        outbox.publish_now(app, messages)
    for job, result in done:
        if result.outcome is not EnqueueOutcome.SKIPPED:
            dedup.remember(job)


def _due_in(job: NewJob) -> timedelta:
    """How long until the first attempt is due: the countdown itself, so this process's
    clock is never set against the database's (an eta is the caller's, i.e. this, clock)."""
    if job.not_before is not None:
        return max(timedelta(0), job.not_before - utcnow())
    return job.delay or timedelta(0)


def _in_session(session: Session, job: NewJob) -> EnqueueResult:
    result = journal.enqueue(session.connection(), job, actor="producer")
    if result.outcome is EnqueueOutcome.ENQUEUED and result.message is not None:
        _pending(session).append((job, result))
    return result


def _pending(session: Session) -> list[Any]:
    # Listeners stay for the session's life (removing one while it fires is an error);
    # with nothing pending they do nothing.
    if not event.contains(session, "after_commit", _publish_session):
        event.listen(session, "after_commit", _publish_session)
        event.listen(session, "after_rollback", _drop_session)
    pending: list[Any] = session.info.setdefault(_PENDING, [])
    return pending


def _publish_session(session: Session) -> None:
    from jobsapp.celery_app import app

    _after_commit(app, session.info.pop(_PENDING, []))


def _drop_session(session: Session) -> None:
    session.info.pop(_PENDING, None)
