"""Transition.RERUN and Transition.REPLAY: a terminal run back to queued, as a new attempt.

``reopen`` is called by enqueue_one.py's ``enqueue_existing`` (RERUN: the same job_id enqueued
again after its dedup window, also from enqueue_many.py) and by operator.py's ``replay``
(REPLAY: a failed run). It raises ``KeyBusy`` when another run holds the concurrency key;
a limited key's run (``key_limit``) joins its key's line instead (key_slots.py), whoever
reopens it, and waits parked when the key's slots are all held.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, select, update
from sqlalchemy.exc import IntegrityError

from jobsapp import crashpoints
from jobsapp.lifecycle.journal import finished_counts, key_slots
from jobsapp.lifecycle.journal._sql import _first, _require_transaction
from jobsapp.lifecycle.journal.clock import clock
from jobsapp.lifecycle.journal.events import record_event
from jobsapp.lifecycle.journal.outbox_rows import PendingMessage, add_outbox
from jobsapp.lifecycle.journal.reads import active_holder, load
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.row_events import counted_through, kept_at_rerun
from jobsapp.lifecycle.journal.run import Run
from jobsapp.lifecycle.rules.states import State, Transition


class KeyBusy(Exception):
    """Another run with the same concurrency key is active."""

    def __init__(self, holder: uuid.UUID | None) -> None:
        super().__init__(f"concurrency key held by job {holder}")
        self.holder = holder


@dataclass(frozen=True)
class Reopened:
    """A run queued again as ``attempt``. ``message`` starts it, to publish after COMMIT;
    None while it waits for a slot of its limited key (the slot's grant publishes it)."""

    attempt: int
    message: PendingMessage | None


def reopen(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    *,
    from_state: State,
    attempts: int,
    budget: int,
    transition: Transition,
    actor: str,
    reason: str,
    now: datetime | None = None,
    finished_before: timedelta | None = None,
) -> Reopened | None:
    """terminal -> queued as a new attempt of the same job; None if the row moved on, or
    finished less than ``finished_before`` ago (a dedup window, on the database's clock).

    Raises KeyBusy when another run holds the concurrency key. A savepoint keeps that
    conflict from aborting the caller's transaction, which must exist: the move, its
    event, the domain's mirror and the next attempt's message commit together or not at all.
    A reopened run is asked to run: it carries no expiry and no cancel request. A success
    the row carried (row_events.py) becomes event rows first: its claim and its success.
    A finish the rollup counted is taken off ``run_counts`` (finished_counts.py).
    """
    _require_transaction(conn, "reopen")
    table = spec.table
    kept = _carried_success(conn, spec, job_id, from_state, attempts)
    finished = finished_counts.finished_row(conn, spec, job_id)
    workflow = _workflow_counted(conn, finished)
    at = clock(conn, now)
    guard = [
        table.c.job_id == job_id,
        table.c.state == from_state.value,
        table.c.attempts == attempts,
    ]
    if finished_before is not None:
        guard.append(table.c.finished_at <= at - finished_before)
    stmt = (
        update(table)
        .where(*guard)
        .values(
            state=State.QUEUED.value,
            outcome=None,
            finished_at=None,
            heartbeat_at=None,
            next_retry_at=None,
            max_attempts=table.c.attempts + budget,
            rescues=0,
            result=None,
            updated_at=at,
            expires_at=None,
            cancel_requested_at=None,
        )
        .returning(*table.c)
    )
    try:
        with conn.begin_nested():
            run = Run.maybe(_first(conn, stmt))
    except IntegrityError:
        key = conn.execute(select(table.c.concurrency_key).where(table.c.job_id == job_id))
        raise KeyBusy(active_holder(conn, spec, key.scalar_one())) from None
    if run is None:
        return None
    crashpoints.hit("reopen_after_update")
    if finished is not None:
        finished_counts.uncount(conn, spec.module, [finished])
        finished_counts.recount(conn, workflow)
    if kept is not None:
        kept_at_rerun(conn, spec, kept[0].columns, kept[1])
    at = run.updated_at  # the database's clock, read by the UPDATE itself
    record_event(
        conn,
        spec,
        job_id,
        attempts + 1,
        transition,
        from_state=from_state,
        to_state=State.QUEUED,
        actor=actor,
        now=at,
        reason=reason,
    )
    spec.changed(conn, transition, [run.columns])
    message = add_outbox(conn, spec, run.columns, attempt=attempts + 1, now=at, available_at=at)
    return Reopened(attempts + 1, _in_line(conn, spec, run, message, now))


def _in_line(
    conn: Connection, spec: RunTable, run: Run, message: PendingMessage, now: datetime | None
) -> PendingMessage | None:
    """A limited key's run takes a slot like an enqueue's, or waits parked (None): a replay
    or a rerun never makes its key's N+1st active run."""
    if run.key_limit is None:
        return message
    holds = key_slots.admit(
        conn,
        spec,
        run.job_id,
        run.concurrency_key,
        run.key_limit,
        due_at=None,
        rerun=True,
        now=now,
    )
    return message if holds else None


def _carried_success(
    conn: Connection, spec: RunTable, job_id: uuid.UUID, from_state: State, attempts: int
) -> tuple[Run, datetime] | None:
    """The succeeded row whose claim and success the rerun is about to clear, with the
    rollup's cursor (locked for share, before the UPDATE: no pass counts the row between);
    None when the row carries no success (its events are rows already)."""
    if from_state is not State.SUCCEEDED:
        return None
    row = load(conn, spec, job_id)
    if (
        row is None
        or row.attempted_at is None
        or row.attempts != attempts
        or row.state != from_state.value
    ):
        return None
    return row, counted_through(conn, spec.module)


def _workflow_counted(conn: Connection, finished: Mapping[str, Any] | None) -> dict[uuid.UUID, str]:
    """The state the run's workflow is counted under (none: no workflow, or not counted)."""
    if finished is None or finished["workflow_id"] is None:
        return {}
    return finished_counts.counted_before(conn, [finished["workflow_id"]])
