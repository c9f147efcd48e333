"""Whose clock a transition reads: a given ``now``, else the database's.

Every transition stamps and compares through these: ``clock`` (a SQL expression for the
statements built per call), ``_stamp`` and ``_clock_param`` (the bound ``r_now`` of a
prebuilt plan, plans.py), ``_later`` (a delay added where Python knows ``now``). No
transition of its own; why the database's clock: the package's docstring.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, func

from jobsapp.db import UtcDateTime, utcnow


def clock(conn: Connection, now: datetime | None = None) -> Any:
    """``now`` if given, else the database's clock as a SQL expression (PostgreSQL) or
    the host's (SQLite, see the module docstring)."""
    if now is not None:
        return now
    return func.now() if conn.dialect.name == "postgresql" else utcnow()


def _stamp(conn: Connection, now: datetime | None) -> datetime | None:
    """The value for a prebuilt plan's ``r_now``: None lets PostgreSQL use its now()."""
    return clock(conn, now) if now is not None or conn.dialect.name != "postgresql" else None


def _clock_param(dialect: str) -> Any:
    """A prebuilt plan's clock: ``r_now`` when bound, else PostgreSQL's now()."""
    given = bindparam("r_now", type_=UtcDateTime())
    return func.coalesce(given, func.now()) if dialect == "postgresql" else given


def _later(now: datetime | None, delay: timedelta | None) -> datetime | None:
    """``now + delay`` where Python knows ``now`` (else the statement adds it)."""
    return None if now is None or delay is None else now + delay
