"""Periodic slots: the due times of a beat entry, each slot's job id, and which to enqueue.

Pure: no I/O and no clock of its own; ``jobsapp.maintenance.periodic`` passes in the
database's clock and the entry's schedule. The policy is argued in docs/periodic.md: a
slot due within the catch-up window and not yet enqueued is enqueued (late); an older
one is skipped.
"""

from __future__ import annotations

import sys
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# Fixed forever: the job ids of slots already in journals are derived from it.
NAMESPACE = uuid.UUID("0b6f6c1e-3d1a-5c55-9a4e-7d3c2a9e4f10")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# The first slot strictly after a moment, as an aware UTC datetime.
NextAfter = Callable[[datetime], datetime]


def utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive datetime has no place in a slot's identity."""
    if moment.tzinfo is None:
        raise ValueError(f"a slot time must be timezone-aware, not {moment!r}")
    return moment.astimezone(UTC)


def slot_job_id(entry: str, due: datetime) -> uuid.UUID:
    """The job id of ``entry``'s slot due at ``due``: the same in every beat, at any time,
    so a second enqueue of the slot is the journal's idempotent duplicate."""
    return uuid.uuid5(NAMESPACE, f"{entry}\n{utc(due).isoformat()}")


def every(period: timedelta) -> NextAfter:
    """Slots every ``period``, aligned to the Unix epoch: beats started at different
    moments, or restarted, find the same slots (Celery counts from its last send)."""
    if period <= timedelta(0):
        raise ValueError(f"a periodic interval must be positive, not {period}")

    def next_after(moment: datetime) -> datetime:
        return EPOCH + ((utc(moment) - EPOCH) // period + 1) * period

    return next_after


@dataclass(frozen=True)
class Plan:
    """What a leader enqueues at one tick, oldest first, and what it gave up on."""

    due: tuple[datetime, ...]
    # (first skipped slot, start of the window): slots in between are never enqueued.
    skipped: tuple[datetime, datetime] | None = None
    # Slots of the window passed over for a later one (an entry without catch-up).
    superseded: int = 0


def plan(
    next_after: NextAfter,
    *,
    last: datetime | None,
    now: datetime,
    window: timedelta,
    limit: int,
    catch_up: bool = True,
) -> Plan:
    """The slots to enqueue at ``now``: due in the window ``(now - window, now]`` and after
    ``last`` (the latest slot this beat enqueued while leading; None when it has not, e.g.
    it just took the lead: then every slot of the window, the journal answering duplicate
    for those another beat enqueued). At most ``limit``; the rest come at the next tick.
    Without ``catch_up`` (Celery's default: a missed entry runs once), only the latest of
    those slots."""
    if not catch_up:
        # Every due slot is walked (the window bounds them), so the latest is the real one.
        walked = plan(next_after, last=last, now=now, window=window, limit=sys.maxsize)
        return _latest(walked)
    start = now - window
    skipped = None
    if last is not None:
        first = next_after(last)
        if first <= start:
            skipped = (first, start)
        start = max(start, last)
    due: list[datetime] = []
    slot = next_after(start)
    while slot <= now and len(due) < limit:
        due.append(slot)
        slot = next_after(slot)
    return Plan(tuple(due), skipped)


def _latest(caught_up: Plan) -> Plan:
    """A plan of every due slot, cut to its latest: the rest are superseded by it."""
    due = caught_up.due
    return Plan(due[-1:], caught_up.skipped, superseded=max(len(due) - 1, 0))


def recent(next_after: NextAfter, *, now: datetime, span: timedelta, limit: int) -> list[datetime]:
    """The latest ``limit`` slots due in ``(now - span, now]``, oldest first."""
    found: deque[datetime] = deque(maxlen=limit)
    slot = next_after(now - span)
    while slot <= now:
        found.append(slot)
        slot = next_after(slot)
    return list(found)
