"""A named lease row: one holder at a time, renewed before it expires."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Table, case, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from jobsapp.db import utcnow
from jobsapp.lifecycle.journal.tables import Lease

LEASES: Table = Lease.__table__  # type: ignore[assignment]
# A maintenance pass's row: the beat that ran it, when, and when it is overdue.
STAMP_PREFIX = "maintenance:"


def acquire(conn: Connection, name: str, holder: str, *, ttl: timedelta, now: datetime) -> bool:
    """Take or renew ``name`` for ``holder``; True while ``holder`` is the leader.

    One statement: insert the lease, or take it over only if it is ours or expired.
    """
    dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    stmt = dialect_insert(LEASES).values(
        name=name, holder=holder, acquired_at=now, renewed_at=now, expires_at=now + ttl
    )
    mine = LEASES.c.holder == stmt.excluded.holder
    upsert = stmt.on_conflict_do_update(
        index_elements=[LEASES.c.name],
        set_={
            "holder": stmt.excluded.holder,
            "renewed_at": stmt.excluded.renewed_at,
            "expires_at": stmt.excluded.expires_at,
            "acquired_at": _keep_if(mine, LEASES.c.acquired_at, stmt.excluded.acquired_at),
        },
        where=mine | (LEASES.c.expires_at < stmt.excluded.renewed_at),
    ).returning(LEASES.c.holder)
    return conn.execute(upsert).scalar() == holder


def stamp(conn: Connection, name: str, holder: str, *, now: datetime, ttl: timedelta) -> None:
    """Record that ``holder`` did ``name``'s work at ``now``, due again by ``now + ttl``;
    a stamp older than the row's (a beat that lost the lease, late) changes nothing."""
    dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    stmt = dialect_insert(LEASES).values(
        name=name, holder=holder, acquired_at=now, renewed_at=now, expires_at=now + ttl
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[LEASES.c.name],
            set_={
                "holder": stmt.excluded.holder,
                "renewed_at": stmt.excluded.renewed_at,
                "expires_at": stmt.excluded.expires_at,
            },
            where=LEASES.c.renewed_at <= stmt.excluded.renewed_at,
        )
    )


def overdue(conn: Connection, names: list[str], now: datetime) -> dict[str, datetime | None]:
    """Which of ``names`` are past their due time: when each last ran (None: never)."""
    query = select(LEASES.c.name, LEASES.c.renewed_at, LEASES.c.expires_at)
    seen = {row.name: row for row in conn.execute(query.where(LEASES.c.name.in_(names)))}
    return {
        name: seen[name].renewed_at if name in seen else None
        for name in names
        if name not in seen or seen[name].expires_at <= now
    }


def _keep_if(cond: Any, kept: Any, new: Any) -> Any:
    return case((cond, kept), else_=new)


def database_now(conn: Connection) -> datetime:
    """The clock every contender reads: beats on hosts whose clocks drift apart must
    still agree when a lease expired. SQLite is one host's file: its clock is ours."""
    if conn.dialect.name != "postgresql":
        return utcnow()
    now: datetime = conn.execute(select(func.clock_timestamp())).scalar_one()
    return now.astimezone(UTC)


def release(conn: Connection, name: str, holder: str) -> None:
    conn.execute(LEASES.delete().where(LEASES.c.name == name, LEASES.c.holder == holder))


def holder_of(conn: Connection, name: str) -> tuple[str, datetime] | None:
    row = conn.execute(
        select(LEASES.c.holder, LEASES.c.expires_at).where(LEASES.c.name == name)
    ).first()
    return None if row is None else (row.holder, row.expires_at)
