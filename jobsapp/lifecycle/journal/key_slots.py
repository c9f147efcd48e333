"""The slots of a limited key (``limit=N``, ``fair``): who holds one, who waits, in order.

A run of a limited task joins its key's line in the transaction that queues it
(``admit``): it takes a free slot number below N, or waits with none. A waiting run is
*parked*: its ``next_retry_at`` and its outbox row's ``available_at`` are ``PARKED``, so
no claim takes it and no relay publishes it; it holds no worker. When a holder lets go
(``release``: its finish, its reap, a fair run's claim) the oldest waiter of the key takes
the slot in the same transaction and is made due (``grant``); its message is returned for
the caller to publish after COMMIT, and the relay publishes it anyway if that fails.
The relay tick's sweep (maintenance/slot_sweep.py, through ``ended_holders`` and
``keys_with_room``) frees the slots of runs that ended another way (cancel, expiry, revoke,
a crash between statements) and grants them within one tick.

The limit is the unique (run_table, concurrency_key, slot_no) of ``key_slots``: there are
N slot numbers, so no transaction on any host makes an N+1st holder. Grants of one key are
serialised by a transaction-scoped advisory lock on PostgreSQL (SQLite has one writer), so
two releases never race for the same waiter or slot number.

Park, grant and release write no state: the run stays ``queued`` throughout; each of their
UPDATEs is guarded on the run still being queued and parked, the outbox row unpublished.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    Table,
    bindparam,
    delete,
    func,
    insert,
    literal,
    select,
    text,
    update,
)

from jobsapp.lifecycle.journal._sql import OUTBOX
from jobsapp.lifecycle.journal.clock import _clock_param, _stamp, clock
from jobsapp.lifecycle.journal.kept_headers import with_kept_headers
from jobsapp.lifecycle.journal.outbox_rows import PendingMessage
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.tables import KeySlot
from jobsapp.lifecycle.rules.states import ACTIVE_STATES, State

SLOTS: Table = KeySlot.__table__  # type: ignore[assignment]
# When a waiting run is due: never, until a slot is granted to it.
PARKED = datetime(9999, 1, 1, tzinfo=UTC)

# The statements of a limited key's every enqueue and finish, built once: one built per
# call (and its cache key) cost more Python than the rest of the admission.
_MINE = (
    SLOTS.c.run_table == bindparam("run_table", type_=SLOTS.c.run_table.type),
    SLOTS.c.concurrency_key == bindparam("key", type_=SLOTS.c.concurrency_key.type),
)
_WAITING = (
    select(SLOTS.c.id, SLOTS.c.job_id, SLOTS.c.due_at)
    .where(*_MINE, SLOTS.c.slot_no.is_(None))
    .order_by(SLOTS.c.id)
    .limit(bindparam("limit", type_=Integer()))
)
_HELD = select(SLOTS.c.slot_no).where(*_MINE, SLOTS.c.slot_no.is_not(None))
_TAKE = (
    update(SLOTS)
    .where(SLOTS.c.id == bindparam("waiter", type_=SLOTS.c.id.type), SLOTS.c.slot_no.is_(None))
    .values(slot_no=bindparam("taken", type_=SLOTS.c.slot_no.type))
)
# A run leaves its key's line (every finish of a limited run).
_LEAVE = (
    delete(SLOTS)
    .where(
        SLOTS.c.run_table == bindparam("run_table", type_=SLOTS.c.run_table.type),
        SLOTS.c.job_id == bindparam("job_id", type_=SLOTS.c.job_id.type),
    )
    .returning(SLOTS.c.concurrency_key, SLOTS.c.slot_no, SLOTS.c.key_limit)
)
_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))")


@cache
def _join(dialect: str) -> Any:
    """A run joins its key's line (the other columns are bound by name)."""
    return insert(SLOTS).values(created_at=_clock_param(dialect))


@dataclass(frozen=True)
class Waiter:
    id: int
    job_id: uuid.UUID
    due_at: datetime | None


@dataclass(frozen=True)
class Granted:
    """The runs a grant gave a slot, and the messages of those it made due."""

    job_ids: frozenset[uuid.UUID] = frozenset()
    messages: tuple[PendingMessage, ...] = ()

    def __add__(self, other: Granted) -> Granted:
        return Granted(self.job_ids | other.job_ids, self.messages + other.messages)


def free_slots(held: Sequence[int], limit: int) -> list[int]:
    """The slot numbers below ``limit`` nobody holds, lowest first (pure)."""
    taken = set(held)
    return [n for n in range(limit) if n not in taken]


def admit(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    key: str,
    limit: int,
    *,
    due_at: datetime | None,
    rerun: bool = False,
    now: datetime | None = None,
) -> bool:
    """Join ``key``'s line for a run just queued (its outbox row written, unpublished):
    True when it holds a slot (a free one, nobody waiting before it): its message is for
    the caller to publish; False when it waits, parked.

    A run queued again (a ``rerun``) leaves the line it was in first. Older waiters given
    a free slot meanwhile (a slot the sweep has not filled yet) are made due and left to
    the relay.
    """
    if rerun:
        release(conn, spec, job_id, now=now)
    conn.execute(
        _join(conn.dialect.name),
        {
            "run_table": spec.table.name,
            "concurrency_key": key,
            "job_id": job_id,
            "key_limit": limit,
            "slot_no": None,
            "due_at": due_at,
            "r_now": _stamp(conn, now),
        },
    )
    holds = job_id in grant(conn, spec, key, limit, now=now, fresh=job_id).job_ids
    if not holds:
        _park(conn, spec, job_id)
    return holds


def release(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    *,
    now: datetime | None = None,
    if_ended: bool = False,
) -> Granted:
    """The run ``job_id`` stops holding (or waiting for) its key's slot; the oldest waiter
    takes the slot. Its message is for the caller to publish after COMMIT.

    ``if_ended`` (the sweep) lets go only of a run that is not active in the statement's
    own snapshot, so a rerun that joined the line meanwhile keeps its place.
    """
    table = spec.table
    params = {"run_table": table.name, "job_id": job_id}
    stmt = _LEAVE
    if if_ended:
        active = select(table.c.job_id).where(
            table.c.job_id == job_id, table.c.state.in_(ACTIVE_STATES)
        )
        stmt = _LEAVE.where(~active.exists())
    gone = conn.execute(stmt, params).first()
    if gone is None or gone.slot_no is None:
        return Granted()
    return grant(conn, spec, gone.concurrency_key, int(gone.key_limit), now=now)


def grant(
    conn: Connection,
    spec: RunTable,
    key: str,
    limit: int,
    *,
    now: datetime | None = None,
    fresh: uuid.UUID | None = None,
) -> Granted:
    """Give ``key``'s free slots (of ``limit``) to its oldest waiters and make them due;
    ``fresh`` (a run joining the line now) was never parked."""
    _lock(conn, spec, key)
    # Read after the lock: a waiter whose line-joining commits later grants itself then.
    mine = {"run_table": spec.table.name, "key": key}
    waiting = conn.execute(_WAITING, {**mine, "limit": limit}).all()
    if not waiting:
        return Granted()
    held = conn.execute(_HELD, mine)
    free = free_slots([int(n) for (n,) in held], limit)
    granted = Granted()
    for waiter, slot_no in zip((Waiter(*w) for w in waiting), free, strict=False):
        taken = conn.execute(_TAKE, {"waiter": waiter.id, "taken": slot_no}).rowcount
        if taken:
            due = () if waiter.job_id == fresh else _unpark(conn, spec, waiter, now)
            granted += Granted(frozenset({waiter.job_id}), due)
    if not granted.messages:  # a run that joins the line and holds at once: no read
        return granted
    # Published by another run's worker or by beat: the headers its caller gave (its
    # lineage, its shadow) are read from the runs, as the relay reads them.
    return replace(granted, messages=tuple(with_kept_headers(conn, granted.messages)))


def _lock(conn: Connection, spec: RunTable, key: str) -> None:
    """Serialise the grants of one key until COMMIT (PostgreSQL; SQLite has one writer)."""
    if conn.dialect.name == "postgresql":
        conn.execute(_LOCK, {"k": f"key_slots:{spec.table.name}:{key}"})


def _park(conn: Connection, spec: RunTable, job_id: uuid.UUID) -> None:
    table = spec.table
    conn.execute(
        update(table)
        .where(table.c.job_id == job_id, table.c.state == State.QUEUED.value)
        .values(next_retry_at=PARKED)
    )
    conn.execute(update(OUTBOX).where(*_unpublished(spec, job_id)).values(available_at=PARKED))


def _unpublished(spec: RunTable, job_id: uuid.UUID) -> tuple[Any, ...]:
    return (
        OUTBOX.c.module == spec.module,
        OUTBOX.c.job_id == job_id,
        OUTBOX.c.published_at.is_(None),
        OUTBOX.c.dead_at.is_(None),
    )


def _unpark(
    conn: Connection, spec: RunTable, waiter: Waiter, now: datetime | None
) -> tuple[PendingMessage, ...]:
    """Make a run granted a slot due (at its own countdown's end, if it had one)."""
    table = spec.table
    at = clock(conn, now)
    due = literal(waiter.due_at, type_=table.c.next_retry_at.type) if waiter.due_at else at
    conn.execute(
        update(table)
        .where(
            table.c.job_id == waiter.job_id,
            table.c.state == State.QUEUED.value,
            table.c.next_retry_at == PARKED,
        )
        .values(next_retry_at=waiter.due_at)
    )
    rows = conn.execute(
        update(OUTBOX)
        .where(*_unpublished(spec, waiter.job_id), OUTBOX.c.available_at == PARKED)
        .values(available_at=due)
        .returning(*OUTBOX.c)
    ).mappings()
    return tuple(PendingMessage.of_row(r) for r in rows)


# ------------------------------------------------------------------ the sweep


def ended_holders(conn: Connection, spec: RunTable, *, limit: int) -> list[uuid.UUID]:
    """Runs with a row in ``key_slots`` that are no longer active (ended another way than
    a finish or a reap: a cancel, an expiry, a revoke), a bounded page."""
    table = spec.table
    stmt = (
        select(SLOTS.c.job_id)
        .select_from(SLOTS.outerjoin(table, table.c.job_id == SLOTS.c.job_id))
        .where(
            SLOTS.c.run_table == table.name,
            table.c.job_id.is_(None) | table.c.state.not_in(ACTIVE_STATES),
        )
        .limit(limit)
    )
    return [job_id for (job_id,) in conn.execute(stmt)]


def keys_with_room(conn: Connection, spec: RunTable, *, limit: int) -> list[tuple[str, int]]:
    """Keys that have a waiter and fewer holders than their limit, a bounded page."""
    held = SLOTS.alias("held")
    holders = (
        select(func.count())
        .where(
            held.c.run_table == SLOTS.c.run_table,
            held.c.concurrency_key == SLOTS.c.concurrency_key,
            held.c.slot_no.is_not(None),
        )
        .scalar_subquery()
    )
    stmt = (
        select(SLOTS.c.concurrency_key, SLOTS.c.key_limit)
        .where(
            SLOTS.c.run_table == spec.table.name,
            SLOTS.c.slot_no.is_(None),
            holders < SLOTS.c.key_limit,
        )
        .distinct()
        .limit(limit)
    )
    return [(key, int(n)) for key, n in conn.execute(stmt)]
