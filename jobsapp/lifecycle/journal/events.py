"""The ``job_events`` row a transition appends, in the transition's own transaction.

``Event`` is that row; a prebuilt plan (plans.py) writes it in the transition's statement
(Transition.ENQUEUE, CLAIM, SUCCEED, FAIL, RETRY, SNOOZE). ``record_event`` appends one
after a statement built per call: reopen.py (Transition.RERUN, REPLAY), cancel.py
(Transition.CANCEL), reap.py (Transition.REAP_REQUEUE, REAP_FAIL), and lifecycle/claim.py
for Transition.SKIP (a foreign message refused by a held concurrency key: no state changes,
so SKIP is not in ``states.ALLOWED``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert

from jobsapp.lifecycle.journal._sql import EVENTS
from jobsapp.lifecycle.journal.clock import clock
from jobsapp.lifecycle.registry import RunTable
from jobsapp.lifecycle.states import State, Transition


@dataclass(frozen=True)
class Event:
    """The ``job_events`` row a transition appends (job_id comes from the changed row)."""

    spec: RunTable
    attempt: int
    transition: Transition
    from_state: State | None
    to_state: State | None
    actor: str
    now: datetime | None  # None: the statement takes the database's clock
    reason: str | None = None
    # A failed attempt's exception: type, scrubbed message and traceback.
    detail: Mapping[str, Any] | None = None

    def values(self, job_id: Any) -> dict[str, Any]:
        return {
            "module": self.spec.module, "job_id": job_id, "attempt": self.attempt,
            "transition": self.transition.value,
            "from_state": self.from_state and self.from_state.value,
            "to_state": self.to_state and self.to_state.value,
            "actor": self.actor, "reason": self.reason, "at": self.now,
            "detail": None if self.detail is None else dict(self.detail),
        }  # fmt: skip



def record_event(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    attempt: int,
    transition: Transition,
    *,
    from_state: State | None,
    to_state: State | None,
    actor: str,
    now: datetime | None = None,
    reason: str | None = None,
) -> None:
    """An event outside a guarded transition (a skip, a batch of reaped runs)."""
    event = Event(spec, attempt, transition, from_state, to_state, actor, now, reason)
    conn.execute(insert(EVENTS).values({**event.values(job_id), "at": clock(conn, now)}))
