"""A revoke (``app.control.revoke``) or an operator's cancel, kept in the journal.

A queued run is cancelled at once (Transition.CANCEL, cancel.py). A running one gets a
cancel request (``cancel_requested_at``, a CANCEL_REQUEST event): from then on its
attempt's fenced writes (heartbeat, succeed, fail, requeue: fence.py ``held``)
are refused, and its worker ends it with ``honour_cancel`` (Transition.CANCEL, running
-> failed/cancelled); a worker that died first leaves it to the reaper (reap.py), which
fails it cancelled rather than requeue it. Any end of a workflow step, queued (cancel.py) or
running, blocks what waited for it and starts none of its errbacks (workflow.cancelled), as
Celery answers a revoke. An operator who asks again, to terminate, leaves another
CANCEL_REQUEST event (``repeat_request``). Called by lifecycle/celery_api/revoke.py and operator.py.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum

from sqlalchemy import Connection, select, update

from jobsapp.lifecycle.journal import workflow
from jobsapp.lifecycle.journal._sql import _first, _require_transaction
from jobsapp.lifecycle.journal.cancel import cancel
from jobsapp.lifecycle.journal.clock import clock
from jobsapp.lifecycle.journal.events import record_event, record_kept_claim
from jobsapp.lifecycle.journal.fence import held
from jobsapp.lifecycle.journal.outbox_rows import PendingMessage
from jobsapp.lifecycle.journal.reads import load
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.run import Run
from jobsapp.lifecycle.rules.states import Outcome, State, Transition

# A run that moves between the read and the guarded write is read again, this many times.
_TRIES = 3


class Revoked(StrEnum):
    CANCELLED = "cancelled"  # it was queued: it never runs
    REQUESTED = "requested"  # it is running: its attempt is told at its next beat
    ENDED = "ended"  # already terminal (or asked before): nothing to do
    UNKNOWN = "unknown"  # no such run in this table
    MOVED = "moved"  # at another attempt than the caller saw: nothing done


def revoke(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    *,
    actor: str,
    reason: str,
    seen: int | None = None,
    started: list[PendingMessage] | None = None,
) -> Revoked:
    """Cancel a queued run, or ask its running attempt to stop.

    ``seen``: the attempts the caller saw (an operator's page); a run at another attempt
    is not revoked blind (MOVED). None: whatever attempt the run is at. ``started``: what a
    queued workflow step's cancel started, to publish after COMMIT (cancel.py)."""
    _require_transaction(conn, "revoke")
    for _ in range(_TRIES):
        row = load(conn, spec, job_id)
        if row is None:
            return Revoked.UNKNOWN
        attempts = row.attempts
        if seen is not None and attempts != seen:
            return Revoked.MOVED
        if row.state == State.QUEUED.value:
            if cancel(
                conn, spec, job_id, attempts=attempts, actor=actor, reason=reason, started=started
            ):
                return Revoked.CANCELLED
        elif row.state == State.RUNNING.value and row.cancel_requested_at is None:
            if _request(conn, spec, job_id, attempts, actor=actor, reason=reason):
                return Revoked.REQUESTED
        else:
            return Revoked.ENDED
    return Revoked.ENDED


def _request(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    attempts: int,
    *,
    actor: str,
    reason: str,
) -> bool:
    table = spec.table
    at = clock(conn)
    stmt = (
        update(table)
        .where(
            table.c.job_id == job_id,
            table.c.state == State.RUNNING.value,
            table.c.attempts == attempts,
            table.c.cancel_requested_at.is_(None),
        )
        .values(cancel_requested_at=at)
        .returning(table.c.cancel_requested_at)
    )
    asked_at: datetime | None = conn.execute(stmt).scalar_one_or_none()
    if asked_at is None:
        return False
    record_event(
        conn,
        spec,
        job_id,
        attempts,
        Transition.CANCEL_REQUEST,
        from_state=State.RUNNING,
        to_state=State.RUNNING,
        actor=actor,
        now=asked_at,
        reason=reason,
    )
    return True


def repeat_request(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    attempt: int,
    *,
    actor: str,
    reason: str,
) -> bool:
    """The audit row of a cancel asked again of a running attempt that was already asked
    to stop (an operator escalating to terminate); False: the run moved on meanwhile."""
    _require_transaction(conn, "repeat_request")
    table = spec.table
    # Locked, so the audit row cannot land after the run's end (SQLite: one writer anyway).
    stmt = (
        select(table.c.job_id)
        .where(
            table.c.job_id == job_id,
            table.c.state == State.RUNNING.value,
            table.c.attempts == attempt,
            table.c.cancel_requested_at.is_not(None),
        )
        .with_for_update()
    )
    if conn.execute(stmt).first() is None:
        return False
    record_event(
        conn,
        spec,
        job_id,
        attempt,
        Transition.CANCEL_REQUEST,
        from_state=State.RUNNING,
        to_state=State.RUNNING,
        actor=actor,
        reason=reason,
    )
    return True


def cancel_requested(
    conn: Connection, spec: RunTable, job_id: uuid.UUID, attempt: int, *, token: uuid.UUID
) -> bool:
    """Whether the running attempt (``attempt``, ``token``) was asked to stop: read only
    after its heartbeat was refused, to tell a revoke from a lost lease."""
    table = spec.table
    stmt = select(table.c.cancel_requested_at).where(
        *held(table, job_id, attempt, token, unless_stopped=False)
    )
    return conn.execute(stmt).scalar() is not None


def honour_cancel(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    attempt: int,
    *,
    token: uuid.UUID,
    actor: str,
    now: datetime | None = None,
    started: list[PendingMessage] | None = None,
) -> bool:
    """running -> failed/cancelled by the attempt's own worker, under its claim's fence,
    only once a cancel was requested; False: no request, or the run moved on. A workflow
    step's end blocks what waited for it (workflow.cancelled), whose messages join
    ``started``, to publish after COMMIT."""
    _require_transaction(conn, "honour_cancel")
    table = spec.table
    at = clock(conn, now)
    reason = "cancelled while running: a revoke or an operator asked it to stop"
    stmt = (
        update(table)
        .where(
            *held(table, job_id, attempt, token, unless_stopped=False),
            table.c.cancel_requested_at.is_not(None),
        )
        .values(
            state=State.FAILED.value,
            outcome=Outcome.CANCELLED.value,
            finished_at=at,
            updated_at=at,
            heartbeat_at=None,
            last_error=reason,
        )
        .returning(*table.c)
    )
    run = Run.maybe(_first(conn, stmt))
    if run is None:
        return False
    record_kept_claim(conn, spec, run)
    record_event(
        conn,
        spec,
        job_id,
        attempt,
        Transition.CANCEL,
        from_state=State.RUNNING,
        to_state=State.FAILED,
        actor=actor,
        now=run.updated_at,
        reason=reason,
    )
    spec.changed(conn, Transition.CANCEL, [run.columns])
    if run.workflow_id is not None:
        blocked = workflow.cancelled(conn, job_id, actor=actor, now=run.updated_at)
        if started is not None:
            started.extend(blocked)
    return True
