"""The relay's statements on outbox rows: what is due, what was lost, what is dead.

``journal`` writes an outbox row in the transaction of the transition that needs it;
everything after that (publish marks, backoff, death, repair counts) is written here.
Every write is guarded by the row state it expects, so two relays at once, or a relay
and an operator, never move one row twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    Select,
    Subquery,
    Table,
    func,
    literal,
    select,
    true,
    tuple_,
    update,
)

from jobsapp.db import utcnow
from jobsapp.lifecycle.journal import OUTBOX, PendingMessage, hot, upsert
from jobsapp.lifecycle.journal.outbox_rows import pending_rows as _pending
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.tables import MaintenanceCounter
from jobsapp.lifecycle.rules.states import State

COUNTERS: Table = MaintenanceCounter.__table__  # type: ignore[assignment]

_LIVE = hot.LIVE
# The counter of queued runs the relay found without an outbox row and repaired.
REPAIRED = "outbox_repaired"


def due_messages(
    conn: Connection, *, now: datetime, limit: int, default_queue: str, lowest_first: bool
) -> list[PendingMessage]:
    """Unpublished live rows that are due (a crash before publish, a retry whose time came),
    in the order the broker serves them (``lifecycle.priorities``): by priority, then the
    longest due. On PostgreSQL the rows of a paused queue or domain are not read at all:
    the open levels are found first, each gives at most ``limit`` rows, and the first
    ``limit`` of those are locked (SKIP LOCKED: another relay has them) and re-checked
    (journal/hot.py: ``due_firsts``, ``due_rows``)."""
    ids: list[int] = []
    if conn.dialect.name == "postgresql":
        first = hot.due_firsts(now, limit, default_queue, lowest_first)
        ids = list(conn.execute(first).scalars())
        if not ids:
            return []
    stmt = hot.due_rows(
        conn.dialect.name,
        now=now,
        limit=limit,
        default_queue=default_queue,
        lowest_first=lowest_first,
        ids=ids,
    )
    return _pending(conn.execute(stmt).mappings())


def rows_by_attempt(
    conn: Connection,
    spec: RunTable,
    keys: Sequence[tuple[uuid.UUID, int]],
    *,
    default_queue: str,
) -> list[PendingMessage]:
    """The named unpublished live rows, locked (SKIP LOCKED: another relay has them)."""
    stmt = (
        select(OUTBOX)
        .where(
            OUTBOX.c.module == spec.module,
            OUTBOX.c.published_at.is_(None),
            _LIVE,
            tuple_(OUTBOX.c.job_id, OUTBOX.c.attempt).in_(list(keys)),
            hot.unpaused(default_queue),
        )
        .with_for_update(skip_locked=True)
    )
    return _pending(conn.execute(stmt).mappings())


def _waiting_for_claim(spec: RunTable) -> Any:
    table = spec.table
    return (table.c.state == State.QUEUED.value) & (table.c.attempts + 1 == OUTBOX.c.attempt)


def _due_inflight(spec: RunTable, now: datetime) -> tuple[Any, ...]:
    return (
        OUTBOX.c.module == spec.module,
        OUTBOX.c.published_at.is_not(None),
        OUTBOX.c.delivered_at.is_(None),
        _LIVE,
        OUTBOX.c.available_at <= now,
    )


def _planned_without_jit(conn: Connection) -> None:
    """No JIT for the rest of this transaction (PostgreSQL). The relay's reads that join a
    run table are estimated over every queued run (the planner cannot know how few of them
    wait for the row's attempt), which at 10^7 runs passes ``jit_above_cost``: compiling the
    unclaimed check took 18.7 ms of the 18.9 it spent finding nothing. Each read is bounded
    by its LIMIT, so JIT never pays for it. ``SET LOCAL``: nothing stays on a server
    connection PgBouncer shares."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL jit = off")


def unclaimed_messages(
    conn: Connection, spec: RunTable, *, now: datetime, limit: int, default_queue: str
) -> list[PendingMessage]:
    """Published rows due for a check whose job still waits for that attempt's claim."""
    _planned_without_jit(conn)
    table = spec.table
    stmt = (
        select(OUTBOX)
        .join(table, table.c.job_id == OUTBOX.c.job_id)
        .where(*_due_inflight(spec, now), _waiting_for_claim(spec), hot.unpaused(default_queue))
        .order_by(OUTBOX.c.available_at)
        .limit(limit)
        .with_for_update(of=OUTBOX, skip_locked=True)
    )
    return _pending(conn.execute(stmt).mappings())


def settle_delivered(conn: Connection, spec: RunTable, *, now: datetime, limit: int) -> int:
    """Mark delivered the published rows whose job moved past their attempt (or is gone)."""
    _planned_without_jit(conn)
    table = spec.table
    moved_on = (
        select(OUTBOX.c.id)
        .outerjoin(table, table.c.job_id == OUTBOX.c.job_id)
        .where(*_due_inflight(spec, now), ~_waiting_for_claim(spec) | table.c.job_id.is_(None))
        .limit(limit)
    )
    # Re-checked outside the subquery: a relay that waited on another's lock must not
    # mark the row a second time.
    stmt = (
        update(OUTBOX)
        .where(OUTBOX.c.id.in_(moved_on), OUTBOX.c.delivered_at.is_(None))
        .values(delivered_at=now)
    )
    return conn.execute(stmt).rowcount


def settle_dead(conn: Connection, spec: RunTable, *, now: datetime, limit: int) -> int:
    """Dead rows whose job moved past their attempt (a copy ran after all, or the job was
    cancelled or pruned): delivered, and no longer dead."""
    table = spec.table
    moved_on = (
        select(OUTBOX.c.id)
        .outerjoin(table, table.c.job_id == OUTBOX.c.job_id)
        .where(
            OUTBOX.c.module == spec.module,
            OUTBOX.c.dead_at.is_not(None),
            OUTBOX.c.delivered_at.is_(None),
            ~_waiting_for_claim(spec) | table.c.job_id.is_(None),
        )
        .limit(limit)
    )
    stmt = (
        update(OUTBOX)
        .where(
            OUTBOX.c.id.in_(moved_on),
            OUTBOX.c.dead_at.is_not(None),
            OUTBOX.c.delivered_at.is_(None),
        )
        .values(delivered_at=now, dead_at=None)
    )
    return conn.execute(stmt).rowcount


def check_later(
    conn: Connection,
    messages: Sequence[PendingMessage],
    *,
    now: datetime,
    wait: Callable[[int], timedelta],
) -> int:
    """Push back the claim check of published rows whose message may still wait in its
    queue, by ``wait(publish count)``; no publish is counted. Guarded by the count seen."""
    by_count: dict[int, list[int]] = {}
    for m in messages:
        by_count.setdefault(m.publish_count, []).append(m.id)
    moved = 0
    for count, ids in by_count.items():
        stmt = (
            update(OUTBOX)
            .where(
                OUTBOX.c.id.in_(ids),
                OUTBOX.c.publish_count == count,
                _LIVE,
                OUTBOX.c.delivered_at.is_(None),
            )
            .values(available_at=now + wait(count))
        )
        moved += conn.execute(stmt).rowcount
    return moved


class Accepted(NamedTuple):
    """A row whose message the broker took: the publish count it was sent at, how long
    after it can be claimed to look for its claim, and when the publish saw it due."""

    id: int
    publish_count: int
    wait: timedelta
    due: datetime


def mark_published(conn: Connection, published: Sequence[Accepted]) -> int:
    """Record the broker's confirmations (one UPDATE on PostgreSQL); returns rows marked."""
    if conn.dialect.name == "postgresql":
        ids, counts, waits, _ = (list(column) for column in zip(*published, strict=True))
        params = {"m_ids": ids, "m_counts": counts, "m_waits": waits}
        return conn.execute(hot.MARK_SENT_MANY, params).rowcount
    marked, now = 0, utcnow()
    for p in published:
        one = {
            "m_id": p.id,
            "m_seen": p.publish_count,
            "m_now": now,
            "m_next_check": max(now, p.due) + p.wait,
        }
        marked += conn.execute(hot.MARK_SENT_ONE, one).rowcount
    return marked


@dataclass(frozen=True)
class Setback:
    """What a failed publish does to its row: try again at ``retry_at``, or die."""

    message: PendingMessage
    error: str
    retry_at: datetime | None  # None: the row is dead


def set_back(conn: Connection, setbacks: Sequence[Setback], *, now: datetime) -> int:
    """Count each failure against its row (guarded by the count seen); returns rows killed."""
    killed = 0
    for s in setbacks:
        dead = s.retry_at is None
        values: dict[str, Any] = {
            "publish_failures": s.message.publish_failures + 1,
            "last_error": s.error,
            "dead_at": now if dead else None,
            "available_at": s.retry_at or now,
        }
        stmt = (
            update(OUTBOX)
            .where(
                OUTBOX.c.id == s.message.id,
                _LIVE,
                OUTBOX.c.publish_failures == s.message.publish_failures,
            )
            .values(**values)
        )
        changed = conn.execute(stmt).rowcount
        killed += changed if dead else 0
    return killed


def bury(conn: Connection, ids: Sequence[int], *, reason: str, now: datetime) -> int:
    """Mark live rows dead (published again and again, never claimed)."""
    if not ids:
        return 0
    stmt = (
        update(OUTBOX)
        .where(OUTBOX.c.id.in_(list(ids)), _LIVE)
        .values(dead_at=now, last_error=reason)
    )
    return conn.execute(stmt).rowcount


@dataclass(frozen=True)
class DeadRow:
    id: int
    module: str
    job_id: uuid.UUID
    attempt: int
    task_name: str
    publish_count: int
    publish_failures: int
    last_error: str | None
    created_at: datetime
    dead_at: datetime


def dead_rows(conn: Connection, *, limit: int) -> list[DeadRow]:
    """The newest dead rows first (the partial index of dead rows)."""
    cols = [OUTBOX.c[f] for f in DeadRow.__dataclass_fields__]
    stmt = select(*cols).where(OUTBOX.c.dead_at.is_not(None))
    rows = conn.execute(stmt.order_by(OUTBOX.c.dead_at.desc()).limit(limit)).mappings()
    return [DeadRow(**r) for r in rows]


def count_dead(conn: Connection) -> int:
    stmt = select(func.count()).select_from(OUTBOX).where(OUTBOX.c.dead_at.is_not(None))
    return int(conn.execute(stmt).scalar_one())


# ------------------------------------------------------------- invariant sweep


Cursor = tuple[datetime, uuid.UUID]


def _has_live_row(spec: RunTable) -> Any:
    """An undelivered outbox row (pending, inflight or dead) for the run's next attempt."""
    table = spec.table
    return (
        select(OUTBOX.c.id)
        .where(
            OUTBOX.c.module == spec.module,
            OUTBOX.c.job_id == table.c.job_id,
            OUTBOX.c.attempt == table.c.attempts + 1,
            OUTBOX.c.delivered_at.is_(None),
        )
        .exists()
    )


def missing_messages(
    conn: Connection, spec: RunTable, *, after: Cursor | None, limit: int
) -> tuple[list[dict[str, Any]], Cursor | None]:
    """Queued runs of the next page (by ``updated_at, job_id``) that have no outbox row for
    their next attempt, locked; and where the following page starts (None: wrap around).

    The page is read in its index order with each run's check beside it: the runs of a page
    were queued together and sit together, while looking each one up again by its key
    walks the whole key index (39 ms a page at 10^7 runs). Only a run the check found
    missing (normally none) is read whole, locked, and checked again under its lock."""
    _planned_without_jit(conn)
    table = spec.table
    queued = table.c.state == State.QUEUED.value
    page = select(table.c.job_id, table.c.updated_at, table.c.attempts).where(queued)
    if after is not None:
        page = page.where(tuple_(table.c.updated_at, table.c.job_id) > tuple_(*after))
    cut = page.order_by(table.c.updated_at, table.c.job_id).limit(limit).subquery()
    checked = _checked_page(conn, spec, cut)
    seen = conn.execute(checked.order_by(cut.c.updated_at, cut.c.job_id)).all()
    if not seen:
        return [], None
    cursor = (seen[-1].updated_at, seen[-1].job_id) if len(seen) == limit else None
    lacking = [r.job_id for r in seen if not r.live]
    if not lacking:
        return [], cursor
    missing = (
        select(table)
        .where(table.c.job_id.in_(lacking), queued, ~_has_live_row(spec))
        .with_for_update(skip_locked=True)
    )
    return [dict(r) for r in conn.execute(missing).mappings()], cursor


def _checked_page(conn: Connection, spec: RunTable, cut: Subquery) -> Select[Any]:
    """``cut``'s runs, each with ``live``: whether its next attempt has an outbox row.

    On PostgreSQL a lookup per run (LATERAL ... LIMIT 1): as an EXISTS beside the runs the
    planner may hash every live outbox row instead (over the uncut queued runs at 10^7, a
    Parallel Seq Scan of the outbox: 350 ms). SQLite has no LATERAL and looks each up."""
    match = (
        OUTBOX.c.module == spec.module,
        OUTBOX.c.job_id == cut.c.job_id,
        OUTBOX.c.attempt == cut.c.attempts + 1,
        OUTBOX.c.delivered_at.is_(None),
    )
    if conn.dialect.name != "postgresql":
        live = select(OUTBOX.c.id).where(*match).exists().label("live")
        return select(cut.c.job_id, cut.c.updated_at, live)
    lookup = select(literal(True).label("live")).where(*match).limit(1).lateral()
    return select(cut.c.job_id, cut.c.updated_at, lookup.c.live).select_from(
        cut.outerjoin(lookup, true())
    )


def bump(conn: Connection, name: str, by: int) -> None:
    """Add ``by`` to the counter ``name`` (created at zero)."""
    if by <= 0:
        return
    stmt = upsert(conn, COUNTERS).values(name=name, value=by)
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[COUNTERS.c.name], set_={"value": COUNTERS.c.value + stmt.excluded.value}
        )
    )


def counters(conn: Connection) -> dict[str, int]:
    return {str(n): int(v) for n, v in conn.execute(select(COUNTERS.c.name, COUNTERS.c.value))}
