"""The ``job_events`` row a transition appends, in the transition's own transaction.

``Event`` is that row; a prebuilt plan (plans.py) writes it in the transition's statement
(Transition.FAIL, RETRY, SNOOZE; CLAIM by insert; SUCCEED of a row that does not carry its
claim). Transition.ENQUEUE, CLAIM and SUCCEED are otherwise carried by the run row
(row_events.py); ``kept_claim`` is the claim a row carried, written as an event row by
every end of an attempt other than a success. ``record_event`` appends one
after a statement built per call: reopen.py (Transition.RERUN, REPLAY), cancel.py
(Transition.CANCEL), reap.py (Transition.REAP_REQUEUE, REAP_FAIL), and lifecycle/worker/claim.py
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
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.run import CarriedClaim
from jobsapp.lifecycle.rules.states import State, Transition


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
        # A StrEnum's str() is its value, without ``.value``'s two Python calls (a finish
        # builds these values on every job's path).
        return {
            "module": self.spec.module,
            "job_id": job_id,
            "attempt": self.attempt,
            "transition": str(self.transition),
            "from_state": None if self.from_state is None else str(self.from_state),
            "to_state": None if self.to_state is None else str(self.to_state),
            "actor": self.actor,
            "reason": self.reason,
            "at": self.now,
            "detail": None if self.detail is None else dict(self.detail),
        }


def kept_claim(spec: RunTable, run: CarriedClaim) -> Event | None:
    """The claim ``run`` carries (``attempted_at``), as the event row an end of its attempt
    other than a success writes before its own; None when the claim has its event row."""
    if run.attempted_at is None:
        return None
    return Event(
        spec,
        run.attempts,
        Transition.CLAIM,
        State.QUEUED,
        State.RUNNING,
        str(run.worker),
        run.attempted_at,
    )


def record_kept_claim(conn: Connection, spec: RunTable, run: CarriedClaim) -> None:
    """``kept_claim`` written, for an end of an attempt built per call (reap.py, revoking.py)."""
    claim = kept_claim(spec, run)
    if claim is not None:
        conn.execute(insert(EVENTS).values(claim.values(run.job_id)))


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
