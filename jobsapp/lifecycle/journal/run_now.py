"""Run now: a queued run waiting for its time (a retry's backoff, a countdown) made due.

The run stays queued, so no transition of ``states.ALLOWED``: its ``next_retry_at`` moves
(only for a queued run of the attempt the operator saw, still not due, not parked in its
key's line), its outbox row (still undelivered and alive) is due again for the relay, and
a ``run_now`` event names the operator. On PostgreSQL the three are one statement (atomic
even in autocommit); elsewhere they run in sequence in the caller's transaction. A message
already handed to the broker with a countdown is sent again, due now: the attempt is
claimed once, and the late copy is refused by the claim's fence as a duplicate. Called by
operator.py (``run_now``).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, true, update

from jobsapp.lifecycle.journal._sql import EVENTS, OUTBOX, _require_transaction
from jobsapp.lifecycle.journal.key_slots import PARKED
from jobsapp.lifecycle.journal.outbox_rows import PendingMessage, pending_rows
from jobsapp.lifecycle.journal.plans import (
    _EVENT_COLUMNS,
    _insert_from_changed,
    _prefixed,
    _sequential_insert,
)
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules.states import State

# The audit row's transition (the run stays queued: not a state change).
RUN_NOW = "run_now"


def bring_forward(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    *,
    attempts: int,
    actor: str,
    reason: str,
    now: datetime,
) -> list[PendingMessage] | None:
    """The run due at ``now``, and its message; None when the run is not a queued one of
    ``attempts`` waiting for a later time (nothing written)."""
    moved, due = _move_run(spec, job_id, attempts, now), _move_message(spec, attempts, now)
    audited = {
        "module": spec.module,
        "attempt": attempts,
        "transition": RUN_NOW,
        "from_state": State.QUEUED.value,
        "to_state": State.QUEUED.value,
        "actor": actor,
        "reason": reason,
        "at": now,
        "detail": None,
    }
    event = _prefixed(audited, "e_")
    if conn.dialect.name == "postgresql":
        return _in_one_statement(conn, moved, due, event)
    _require_transaction(conn, "run now")
    if conn.execute(moved).first() is None:
        return None
    messages = pending_rows(conn.execute(due.where(OUTBOX.c.job_id == job_id)).mappings())
    conn.execute(_sequential_insert(EVENTS, _EVENT_COLUMNS, "e_"), {**event, "e_job_id": job_id})
    return messages


def _move_run(spec: RunTable, job_id: uuid.UUID, attempts: int, now: datetime) -> Any:
    t = spec.table
    return (
        update(t)
        .where(
            t.c.job_id == job_id,
            t.c.state == State.QUEUED.value,
            t.c.attempts == attempts,
            # A run waiting for its key's slot starts when the slot frees, not sooner.
            t.c.next_retry_at > now,
            t.c.next_retry_at != PARKED,
        )
        .values(next_retry_at=now, updated_at=now)
        .returning(t.c.job_id)
    )


def _move_message(spec: RunTable, attempts: int, now: datetime) -> Any:
    """The UPDATE of the run's next message, but for which job (the caller adds it)."""
    o = OUTBOX.c
    return (
        update(OUTBOX)
        .where(
            o.module == spec.module,
            o.attempt == attempts + 1,
            o.dead_at.is_(None),
            o.delivered_at.is_(None),
        )
        .values(available_at=now, published_at=None)
        .returning(*OUTBOX.c)
    )


def _in_one_statement(
    conn: Connection, moved: Any, due: Any, event: dict[str, Any]
) -> list[PendingMessage] | None:
    """The three writes as CTEs of one statement, the message and the event reading the
    moved run: a row per message moved, one row of NULLs when the run moved and its
    message did not (delivered, dead), none when the run did not move."""
    run = moved.cte("moved")
    message = due.where(OUTBOX.c.job_id.in_(select(run.c.job_id))).cte("due")
    audit = _insert_from_changed(EVENTS, _EVENT_COLUMNS, "e_", {"job_id": run.c.job_id})
    stmt = (
        select(run.c.job_id.label("moved_job_id"), message)
        .select_from(run.outerjoin(message, true()))
        .add_cte(audit.cte("audit"))
    )
    rows = list(conn.execute(stmt, event).mappings())
    if not rows:
        return None
    return pending_rows(r for r in rows if r["id"] is not None)
