"""Server-side prepared statements for the journal's hot transitions (PostgreSQL, psycopg2).

Each hot transition is one CTE statement that Postgres would otherwise parse and plan on
every call: planning alone measured 0.11-0.20 ms per statement (pg_stat_statements on a
durable Postgres), about as much as executing it. Here each statement is PREPAREd once per
database connection, with its parameter types spelled out, and then run as ``EXECUTE``.
Bind and result processing stay SQLAlchemy's, through a typed textual statement.

Only on autocommit connections: there a failed EXECUTE has changed nothing, so when a
pooler in transaction mode (PgBouncer, whose ``max_prepared_statements`` tracks only
protocol-level prepares, not SQL ``PREPARE``) hands the EXECUTE to a server
connection that never saw the PREPARE, the statement is simply run unprepared, and the
engine stops preparing from then on; so too when the re-prepare after a schema change
meets such a server connection. A statement's name is derived from its text, so a
same-named statement another client prepared on a pooled server connection is the same
statement.
"""

from __future__ import annotations

import hashlib
import logging
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import Connection, CursorResult, Engine, bindparam, column, text
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Select
from sqlalchemy.sql.selectable import TextualSelect

from jobsapp.db import is_autocommit

log = logging.getLogger(__name__)

# The connection's (DBAPI record's) set of statement names it has prepared.
_INFO_KEY = "jobsapp_prepared"
# "cached plan must not change result type": a migration changed a column the statement
# returns while this connection kept its PREPARE (a rolling deploy). Prepared anew, once.
_STALE_PLAN = "0A000"
# SQLSTATEs of a statement a pooled server connection does not know, or already knows,
# and of a stale plan met again right after preparing anew.
_POOLER_CODES = frozenset({"26000", "42P05", _STALE_PLAN})
_unprepared: weakref.WeakSet[Engine] = weakref.WeakSet()


@dataclass(frozen=True)
class Prepared:
    name: str
    prepare: str  # PREPARE name (types) AS statement
    execute: TextualSelect  # EXECUTE name(...), with the statement's bind and result types


def execute(conn: Connection, stmt: Select[Any], params: Mapping[str, Any]) -> CursorResult[Any]:
    """``conn.execute(stmt, params)``, prepared where the connection allows it."""
    if not _usable(conn):
        return conn.execute(stmt, params)
    plan = _prepared(stmt, conn.dialect)
    try:
        _ensure(conn, plan)
        return _executed(conn, plan, params)
    except DBAPIError as exc:
        if _code(exc) not in _POOLER_CODES:
            raise
    _unprepared.add(conn.engine)
    log.warning(
        "prepared statements do not survive this connection pool (a pooler in "
        "transaction mode?): the journal runs its statements unprepared"
    )
    return conn.execute(stmt, params)


def _code(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "pgcode", None)


def _executed(conn: Connection, plan: Prepared, params: Mapping[str, Any]) -> CursorResult[Any]:
    try:
        return conn.execute(plan.execute, params)
    except DBAPIError as exc:
        if _code(exc) != _STALE_PLAN:
            raise
    return _prepared_again(conn, plan, params)


def _prepared_again(
    conn: Connection, plan: Prepared, params: Mapping[str, Any]
) -> CursorResult[Any]:
    """Behind a pooler each of these may land on another server connection: one without
    the statement (26000), one that has it already (42P05), or one whose plan is stale
    too (0A000 again). Each such failure changed nothing, and ``execute`` then runs the
    statement unprepared."""
    conn.exec_driver_sql(f"DEALLOCATE {plan.name}")
    conn.exec_driver_sql(plan.prepare)
    log.info("prepared statement %s was re-prepared after a schema change", plan.name)
    return conn.execute(plan.execute, params)


def _usable(conn: Connection) -> bool:
    return (
        conn.dialect.driver == "psycopg2" and is_autocommit(conn) and conn.engine not in _unprepared
    )


def _ensure(conn: Connection, plan: Prepared) -> None:
    done: set[str] = conn.connection.info.setdefault(_INFO_KEY, set())
    if plan.name not in done:
        conn.exec_driver_sql(plan.prepare)
        done.add(plan.name)


@cache
def _prepared(stmt: Select[Any], dialect: Dialect) -> Prepared:
    # The same dialect with $n placeholders: the text PREPARE needs.
    numbered = type(dialect)(paramstyle="numeric_dollar")  # type: ignore[call-arg]
    compiled = stmt.compile(dialect=numbered)
    names = list(compiled.positiontup or ())
    binds = [compiled.binds[n] for n in names]
    types = ", ".join(numbered.type_compiler_instance.process(b.type) for b in binds)
    name = "jobsapp_" + hashlib.sha256(f"{types}|{compiled.string}".encode()).hexdigest()[:20]
    # Constants the statement carries (a state literal) keep their values; the caller's
    # named parameters stay required, as in the statement itself.
    typed = [
        bindparam(n, b.effective_value if b.unique else None, type_=b.type, required=not b.unique)
        for n, b in zip(names, binds, strict=True)
    ]
    args = ", ".join(f":{n}" for n in names)
    results = [column(str(c.key), c.type) for c in stmt.selected_columns]
    run = text(f"EXECUTE {name}({args})").bindparams(*typed).columns(*results)
    return Prepared(name, f"PREPARE {name} ({types}) AS {compiled.string}", run)
