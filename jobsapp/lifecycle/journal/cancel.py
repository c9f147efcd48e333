"""Transition.CANCEL: queued -> failed/cancelled, by an operator.

Called by operator.py's ``cancel`` (the admin UI, the API and ``jobsapp cancel``).
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Connection, update

from jobsapp.lifecycle.journal._sql import _first, _require_transaction
from jobsapp.lifecycle.journal.clock import clock
from jobsapp.lifecycle.journal.events import record_event
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.run import Run
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
) -> bool:
    """queued -> failed/cancelled by an operator, fenced by the ``attempts`` the operator
    saw (a retry that ran meanwhile is another attempt); a running job must finish or be
    reaped."""
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
    return True
