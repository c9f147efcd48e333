"""Run now: a queued job waiting for its time (a retry's backoff, a countdown) made due.

One guarded statement moves the run (only a queued run of the attempt the operator saw,
still not due), one moves its outbox row (still undelivered and alive) back to the relay's
due set, and one audit row names the operator. A message already handed to the broker
with a countdown is sent again, due now: the attempt is claimed once, and the late copy
is refused by the claim's fence as a duplicate.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Connection, insert, update

from jobsapp.lifecycle.journal import EVENTS, OUTBOX, PendingMessage
from jobsapp.lifecycle.journal.slots import PARKED
from jobsapp.lifecycle.outbox_queries import _pending
from jobsapp.lifecycle.registry import RunTable
from jobsapp.lifecycle.states import State

# The audit row's transition (the run stays queued: not a state change).
RUN_NOW = "run_now"


def bring_forward(
    conn: Connection, spec: RunTable, job_id: uuid.UUID, *, attempts: int, actor: str,
    reason: str, now: datetime,
) -> list[PendingMessage] | None:  # fmt: skip
    """The run due at ``now``, and its message; None when the run is not a queued one of
    ``attempts`` waiting for a later time (nothing written)."""
    t = spec.table
    moved = conn.execute(
        update(t)
        .where(t.c.job_id == job_id, t.c.state == State.QUEUED.value, t.c.attempts == attempts,
               # A run waiting for its key's slot starts when the slot frees, not sooner.
               t.c.next_retry_at > now, t.c.next_retry_at != PARKED)
        .values(next_retry_at=now, updated_at=now)
        .returning(t.c.job_id)
    ).first()  # fmt: skip
    if moved is None:
        return None
    o = OUTBOX.c
    due = conn.execute(
        update(OUTBOX)
        .where(o.module == spec.module, o.job_id == job_id, o.attempt == attempts + 1,
               o.dead_at.is_(None), o.delivered_at.is_(None))
        .values(available_at=now, published_at=None)
        .returning(*OUTBOX.c)
    ).mappings()  # fmt: skip
    messages = _pending(due)
    conn.execute(insert(EVENTS).values(
        module=spec.module, job_id=job_id, attempt=attempts, transition=RUN_NOW,
        from_state=State.QUEUED.value, to_state=State.QUEUED.value, actor=actor, reason=reason,
        at=now,
    ))  # fmt: skip
    return messages
