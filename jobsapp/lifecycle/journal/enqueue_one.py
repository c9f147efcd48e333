"""Transition.ENQUEUE, one job at a time: none -> queued, with its first message; the row
carries the enqueue (``enqueued_by``, its ``created_at``), no event row.

``enqueue_new`` inserts the run (one statement on PostgreSQL); ``enqueue_existing`` answers
an insert that conflicted: duplicate, skipped (``active_holder``), or a rerun (reopen.py,
Transition.RERUN, which puts a limited key's rerun in its key's line); ``enqueue`` does both,
and puts a new run of a limited key in its key's line (key_slots.py): it holds a slot, or waits
parked. Called by lifecycle/producer/enqueue.py (the producer's paths behind ``LifecycleTask``); a
batch of jobs is enqueue_many.py's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from sqlalchemy import Connection, select

from jobsapp.lifecycle.journal import key_slots
from jobsapp.lifecycle.journal.clock import _stamp
from jobsapp.lifecycle.journal.events import Event
from jobsapp.lifecycle.journal.new_run import NewJob, _insert_params, _new_row
from jobsapp.lifecycle.journal.outbox_rows import PendingMessage, outgoing
from jobsapp.lifecycle.journal.plans import _insert_plan, _run
from jobsapp.lifecycle.journal.reads import active_holder
from jobsapp.lifecycle.journal.reopen import KeyBusy, reopen
from jobsapp.lifecycle.rules.states import State, Transition, is_terminal


class EnqueueOutcome(StrEnum):
    ENQUEUED = "enqueued"
    DUPLICATE = "duplicate"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class EnqueueResult:
    outcome: EnqueueOutcome
    job_id: uuid.UUID
    message: PendingMessage | None = None
    holder: uuid.UUID | None = None


def enqueue(
    conn: Connection, job: NewJob, *, actor: str, now: datetime | None = None
) -> EnqueueResult:
    """none -> queued; a known job_id is a duplicate (or a rerun past its dedup window).

    ``conn`` is in a transaction: a rerun takes several statements.
    """
    inserted = enqueue_new(conn, job, now=now, actor=actor)
    if inserted is None:
        return enqueue_existing(conn, job, now=now, actor=actor)
    return inserted if job.key_limit is None else _in_line(conn, job, inserted, now=now)


def _in_line(
    conn: Connection, job: NewJob, result: EnqueueResult, *, now: datetime | None
) -> EnqueueResult:
    """A new run of a limited key holds a slot, or waits parked with no message to publish."""
    delayed = job.not_before is not None or job.delay is not None
    due_at = result.message.available_at if delayed and result.message else None
    holds = key_slots.admit(
        conn, job.spec, job.job_id, job.concurrency_key, job.key_limit or 1, due_at=due_at, now=now
    )
    return result if holds else replace(result, message=None)


def enqueue_new(
    conn: Connection, job: NewJob, *, actor: str, now: datetime | None = None
) -> EnqueueResult | None:
    """none -> queued in one statement (autocommit allowed); None if the job_id or the
    concurrency key is taken: ``enqueue_existing`` then decides, in a transaction."""
    now = _stamp(conn, now)
    row = _new_row(job, now, State.QUEUED, 0, enqueued_by=actor)
    plan = _insert_plan(job.spec, conn.dialect.name, State.QUEUED)
    event = Event(job.spec, 1, Transition.ENQUEUE, None, State.QUEUED, actor, now)
    out = outgoing(
        job.spec,
        row,
        attempt=1,
        now=now,
        available_at=row["next_retry_at"] or now,
        traceparent=job.traceparent,
        lineage=job.lineage,
    )
    inserted, message = _run(conn, plan, _insert_params(row, now, job), event, out)
    if inserted is None:
        return None
    return EnqueueResult(EnqueueOutcome.ENQUEUED, job.job_id, message=message)


def enqueue_existing(
    conn: Connection, job: NewJob, *, actor: str, now: datetime | None = None
) -> EnqueueResult:
    """The answer to an enqueue whose insert conflicted: duplicate, skipped, or a rerun."""
    table = job.spec.table
    seen = conn.execute(
        select(table.c.state, table.c.attempts).where(table.c.job_id == job.job_id)
    ).first()
    if seen is None:
        holder = active_holder(conn, job.spec, job.concurrency_key)
        return EnqueueResult(EnqueueOutcome.SKIPPED, job.job_id, holder=holder)
    if not is_terminal(seen.state):
        return EnqueueResult(EnqueueOutcome.DUPLICATE, job.job_id)
    try:
        reopened = reopen(
            conn,
            job.spec,
            job.job_id,
            from_state=State(seen.state),
            attempts=seen.attempts,
            budget=job.max_attempts,
            transition=Transition.RERUN,
            now=now,
            actor=actor,
            reason="enqueued again",
            finished_before=job.dedup_window,
        )
    except KeyBusy as busy:
        return EnqueueResult(EnqueueOutcome.SKIPPED, job.job_id, holder=busy.holder)
    if reopened is None:
        return EnqueueResult(EnqueueOutcome.DUPLICATE, job.job_id)
    return EnqueueResult(EnqueueOutcome.ENQUEUED, job.job_id, message=reopened.message)
