"""The producer's path: journal row + outbox row in one transaction, publish after COMMIT.

A caller's ORM ``Session`` is joined and its messages are published by an after-commit
hook (dropped on rollback). A caller's Core ``Connection`` is joined too, but Core has no
after-commit hook: its messages are published by the relay in beat.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta

from celery import Celery
from sqlalchemy import Connection, event
from sqlalchemy.orm import Session

from jobsapp import crashpoints
from jobsapp.db import autocommit, get_engine, utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.journal import EnqueueOutcome, EnqueueResult, NewJob
from jobsapp.lifecycle.journal.schema_checked import SchemaChecked
from jobsapp.lifecycle.producer import dedup
from jobsapp.lifecycle.transport import outbox
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
        return JobHandle(
            job.job_id, EnqueueOutcome.DUPLICATE, job.spec, task=job.task_name, app=app
        )
    if session is not None:
        with SchemaChecked(session.connection()):
            result = _in_session(app, session, job)
    elif connection is not None:
        with SchemaChecked(connection):
            result = journal.enqueue(connection, job, actor="producer")
    else:
        with SchemaChecked():
            result = _own_transaction(app, job)
    return JobHandle(
        result.job_id, result.outcome, job.spec, holder=result.holder, task=job.task_name, app=app
    )


class Batch:
    """Enqueues that join one transaction with the caller's own writes; see ``transaction``.

    A batch from ``transaction`` collects its jobs and writes them together, a few
    multi-row statements per run table, when the block ends, when a handle's outcome is
    read, or when the caller takes ``conn`` (so its own statements see the rows, as if
    each job had been written at once). ``Batch(conn)`` made directly (Django's helper,
    which has no block end to hook) writes each job as it is added.
    """

    def __init__(self, conn: Connection, *, deferred: bool = False) -> None:
        self._conn = conn
        self._deferred = deferred
        self._waiting: list[NewJob] = []
        self._done: list[tuple[NewJob, EnqueueResult]] = []

    @property
    def conn(self) -> Connection:
        self.flush()
        return self._conn

    def add(self, job: NewJob) -> JobHandle:
        if self._deferred:
            self._waiting.append(job)
            return _DeferredHandle(self, len(self._done) + len(self._waiting) - 1, job)
        with SchemaChecked(self._conn):
            result = journal.enqueue(self._conn, job, actor="producer")
        self._done.append((job, result))
        return JobHandle(
            result.job_id, result.outcome, job.spec, holder=result.holder, task=job.task_name
        )

    def flush(self) -> None:
        """Write the jobs added since the last flush, in the order they were added."""
        if not self._waiting:
            return
        jobs, self._waiting = self._waiting, []
        results = journal.enqueue_many(self._conn, jobs, actor="producer")
        self._done.extend(zip(jobs, results, strict=True))

    def result(self, index: int) -> EnqueueResult:
        """The answer to the ``index``-th job added (written first if it is waiting)."""
        if index >= len(self._done):
            self.flush()
        return self._done[index][1]

    def publish(self, app: Celery) -> None:
        publish_committed(app, self._done)


class _DeferredHandle(JobHandle):
    """A handle whose outcome (and holder) the batch writes when it is first read."""

    _batch: Batch
    _index: int

    def __init__(self, batch: Batch, index: int, job: NewJob) -> None:
        self._batch, self._index = batch, index
        super().__init__(job.job_id, EnqueueOutcome.ENQUEUED, job.spec, task=job.task_name)

    def _said(self) -> str:
        # Reading the outcome writes the batch: a repr must not.
        return "written at the end of the batch"

    @property
    def outcome(self) -> EnqueueOutcome:
        return self._batch.result(self._index).outcome

    @property
    def holder(self) -> uuid.UUID | None:
        return self._batch.result(self._index).holder


@contextmanager
def transaction(app: Celery) -> Iterator[Batch]:
    """One transaction for the caller's rows and any number of enqueues; publish after COMMIT.

    ``with transaction(app) as batch: batch.conn.execute(...); task.enqueue_in(batch, ...)``
    Nothing is written or published if the block raises.
    """
    with SchemaChecked(), get_engine().begin() as conn:
        batch = Batch(conn, deferred=True)
        yield batch
        batch.flush()
    batch.publish(app)


def _own_transaction(app: Celery, job: NewJob) -> EnqueueResult:
    engine = get_engine()
    if job.key_limit is not None:
        # The run and its place in its key's line commit together.
        with engine.begin() as conn:
            in_line = journal.enqueue(conn, job, actor="producer")
        publish_committed(app, [(job, in_line)])
        return in_line
    with autocommit(engine) as conn:
        result = journal.enqueue_new(conn, job, actor="producer")
    if result is None:
        # Taken job_id or key: the answer (and a rerun's several writes) needs a transaction.
        with engine.begin() as conn:
            result = journal.enqueue_existing(conn, job, actor="producer")
    publish_committed(app, [(job, result)])
    return result


def publish_committed(app: Celery, done: Sequence[tuple[NewJob, EnqueueResult]]) -> None:
    """Publish what a committed transaction enqueued (one mark for all of it)."""
    crashpoints.hit("after_commit_before_publish")
    # A delayed start within the short-wait limit rides a countdown; longer ones wait in
    # the outbox for the relay (a long broker ETA is redelivered on Redis, and run twice).
    horizon = timedelta(seconds=get_settings().inline_wait_max)
    now = utcnow()  # one reading for the whole commit's messages
    messages = [
        journal.on_local_clock(result.message, due_in, now)
        for job, result in done
        if result.message is not None and (due_in := _due_in(job)) <= horizon
    ]
    if messages:
        outbox.publish_now(app, messages)
    for job, result in done:
        dedup.remember(job, result.outcome)


def _due_in(job: NewJob) -> timedelta:
    """How long until the first attempt is due: the countdown itself, so this process's
    clock is never set against the database's (an eta is the caller's, i.e. this, clock)."""
    if job.not_before is not None:
        return max(timedelta(0), job.not_before - utcnow())
    return job.delay or timedelta(0)


def _in_session(app: Celery, session: Session, job: NewJob) -> EnqueueResult:
    result = journal.enqueue(session.connection(), job, actor="producer")
    if result.outcome is EnqueueOutcome.ENQUEUED and result.message is not None:
        _pending(session, app).append((job, result))
    return result


def _pending(session: Session, app: Celery) -> list[tuple[NewJob, EnqueueResult]]:
    """What ``app`` publishes when the session commits."""
    # Listeners stay for the session's life (removing one while it fires is an error);
    # with nothing pending they do nothing.
    if not event.contains(session, "after_commit", _publish_session):
        event.listen(session, "after_commit", _publish_session)
        event.listen(session, "after_rollback", _drop_session)
    by_app: dict[Celery, list[tuple[NewJob, EnqueueResult]]]
    by_app = session.info.setdefault(_PENDING, {})
    return by_app.setdefault(app, [])


def _publish_session(session: Session) -> None:
    for app, done in session.info.pop(_PENDING, {}).items():
        publish_committed(app, done)


def _drop_session(session: Session) -> None:
    session.info.pop(_PENDING, None)
