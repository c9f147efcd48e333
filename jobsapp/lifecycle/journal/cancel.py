"""Transition.CANCEL: queued -> failed/cancelled, by a revoke or an operator.

A workflow step cancelled while queued blocks what waited for it, in the same transaction,
as its cancel while running does (workflow.cancelled): Celery's worker drops a revoked
message and marks it revoked, which fails a chord it is a member of. Here, not in each
caller, so no queued end forgets it. Called by revoking.py (``app.control.revoke``,
operator.py's ``cancel``), lifecycle/celery_api/revoke.py (a worker's list of revoked ids)
and ``cancel_rest`` (an operator's cancel of what is left of a workflow).
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Connection, or_, update

from jobsapp.lifecycle.journal import finished_counts, registry, workflow
from jobsapp.lifecycle.journal._sql import _first, _require_transaction
from jobsapp.lifecycle.journal.clock import clock
from jobsapp.lifecycle.journal.events import record_event
from jobsapp.lifecycle.journal.outbox_rows import PendingMessage
from jobsapp.lifecycle.journal.reads import step_runs
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.run import Run
from jobsapp.lifecycle.journal.workflow import CANCELLED, STEPS
from jobsapp.lifecycle.rules.states import Outcome, State, Transition


def cancel(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    *,
    attempts: int,
    actor: str,
    reason: str,
    now: datetime | None = None,
    started: list[PendingMessage] | None = None,
) -> bool:
    """queued -> failed/cancelled, fenced by the ``attempts`` the caller saw (a retry that
    ran meanwhile is another attempt); a running job must finish or be reaped. A workflow
    step's cancel blocks what waited for it; the messages of what that starts (a chord
    body's errbacks) join ``started``, for the caller to publish after COMMIT (the relay
    otherwise)."""
    _require_transaction(conn, "cancel")
    table = spec.table
    at = clock(conn, now)
    stmt = (
        update(table)
        .where(
            table.c.job_id == job_id,
            table.c.state == State.QUEUED.value,
            table.c.attempts == attempts,
        )
        .values(
            state=State.FAILED.value,
            outcome=Outcome.CANCELLED.value,
            finished_at=at,
            updated_at=at,
            next_retry_at=None,
            last_error=reason,
        )
        .returning(*table.c)
    )
    run = Run.maybe(_first(conn, stmt))
    if run is None:
        return False
    record_event(
        conn,
        spec,
        job_id,
        attempts + 1,
        Transition.CANCEL,
        from_state=State.QUEUED,
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


def cancel_rest(
    conn: Connection,
    workflow_id: uuid.UUID,
    *,
    actor: str,
    reason: str,
    now: datetime | None = None,
) -> int:
    """An operator's cancel of what is left of a workflow: no step starts from now on
    (a step still running finishes, and starts nothing), and its queued runs end
    cancelled (Transition.CANCEL each). Returns how many runs were cancelled.

    The steps are marked first, under their rows' locks: a step's success that starts a
    successor holds the successor's lock, so its queued run is seen and cancelled here,
    or it sees the mark and starts nothing. A finished workflow already counted is
    counted as failed from now on (finished_counts.py)."""
    _require_transaction(conn, "a workflow's cancel")
    counted = finished_counts.counted_before(conn, [workflow_id])
    marked = [
        dict(step)
        for step in conn.execute(
            update(STEPS)
            .where(
                STEPS.c.workflow_id == workflow_id,
                or_(STEPS.c.blocked_outcome.is_(None), STEPS.c.blocked_outcome != CANCELLED),
            )
            .values(blocked_at=clock(conn, now), blocked_outcome=CANCELLED, blocked_reason=reason)
            .returning(STEPS.c.job_id, STEPS.c.module)
        ).mappings()
    ]
    module_of = {step["job_id"]: step["module"] for step in marked}
    queued = step_runs(conn, marked, "attempts", state=State.QUEUED)
    finished_counts.recount(conn, counted)
    return sum(
        cancel(
            conn,
            registry.get(module_of[job_id]),
            job_id,
            attempts=run.attempts,
            actor=actor,
            reason=reason,
            now=now,
        )
        for job_id, run in queued.items()
    )
