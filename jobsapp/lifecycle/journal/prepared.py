"""Server-side prepared statements for the journal's hot transitions (PostgreSQL, psycopg2).

Each hot transition is one CTE statement that Postgres would otherwise parse and plan on
every call: planning alone measured 0.11-0.20 ms per statement (pg_stat_statements on a
durable Postgres), about as much as executing it. Here each statement is PREPAREd once per
database connection, with its parameter types spelled out, and then run as ``EXECUTE``.

The ``EXECUTE`` skips SQLAlchemy's statement execution (execution context, compiled-cache
lookup, result object: about 60 Python calls a statement, two or three statements a job):
it goes to the connection's DBAPI cursor through ``Connection._cursor_execute``,
SQLAlchemy's own path for statements it did not compile, which still fires the
``before_cursor_execute`` and ``after_cursor_execute`` listeners (the cost harness counts
statements there; the relaxed engine adds its ``SET LOCAL`` there) and turns a driver
error into SQLAlchemy's ``DBAPIError`` (invalidating the pool on a lost connection). The
values go in positional order, encoded as SQLAlchemy would (its bind processors), and the
row comes back decoded as SQLAlchemy would (its result processors; ``UtcDateTime`` inline,
with no call per column), as a dict of column values.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from functools import cache
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection, Engine, Uuid
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Select
from sqlalchemy.types import TypeEngine

from jobsapp.db import UtcDateTime, is_autocommit
from jobsapp.lifecycle.journal._sql import _first_row

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

Row = dict[str, Any]
# A column's position and SQLAlchemy's processor of its values.
Processors = tuple[tuple[int, Callable[[Any], Any]], ...]
# A value's position, SQLAlchemy's processor, and what it makes of None (a JSON column's
# None is JSON null: read once, not serialized on every job's empty result).
Encoders = tuple[tuple[int, Callable[[Any], Any], Any], ...]


@dataclass(frozen=True)
class Prepared:
    name: str
    prepare: str  # PREPARE name (types) AS statement
    execute: str  # EXECUTE name(%s, ...): the values in ``order``
    order: Callable[[Mapping[str, Any]], tuple[Any, ...]]  # the values, by name
    constants: Mapping[str, Any]  # the statement's own values (a state literal)
    encoders: Encoders  # by position in ``order``: a JSON value's serializer
    utc_values: tuple[int, ...]  # UtcDateTime values, by position
    uuid_values: tuple[int, ...]  # Uuid values, by position
    columns: tuple[str, ...]  # the row's names
    types: tuple[TypeEngine[Any], ...]  # the row's types, for its decoders
    utc_columns: tuple[int, ...]  # UtcDateTime columns, by position


# Per statement name, the result processors learned from its first row's description
# (a numeric type's processor depends on the type the server sends).
_decoders: dict[str, Processors] = {}


def first(conn: Connection, stmt: Select[Any], params: Mapping[str, Any]) -> Row | None:
    """The first row of ``conn.execute(stmt, params)``, prepared where the connection
    allows it."""
    if not _usable(conn):
        return _first_row(conn.execute(stmt, params))
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
    return _first_row(conn.execute(stmt, params))


def _code(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "pgcode", None)


def _executed(conn: Connection, plan: Prepared, params: Mapping[str, Any]) -> Row | None:
    try:
        return _fetched(conn, plan, params)
    except DBAPIError as exc:
        if _code(exc) != _STALE_PLAN:
            raise
    return _prepared_again(conn, plan, params)


def _prepared_again(conn: Connection, plan: Prepared, params: Mapping[str, Any]) -> Row | None:
    """Behind a pooler each of these may land on another server connection: one without
    the statement (26000), one that has it already (42P05), or one whose plan is stale
    too (0A000 again). Each such failure changed nothing, and ``first`` then runs the
    statement unprepared."""
    conn.exec_driver_sql(f"DEALLOCATE {plan.name}")
    conn.exec_driver_sql(plan.prepare)
    _decoders.pop(plan.name, None)  # the changed column's type is read anew
    log.info("prepared statement %s was re-prepared after a schema change", plan.name)
    return _fetched(conn, plan, params)


def _fetched(conn: Connection, plan: Prepared, params: Mapping[str, Any]) -> Row | None:
    """The EXECUTE on the DBAPI cursor, its first row decoded."""
    with conn.connection.dbapi_connection.cursor() as cursor:  # type: ignore[union-attr]
        conn._cursor_execute(cursor, plan.execute, _bound(plan, params))
        row = cursor.fetchone()
        if row is None:
            return None
        decoders = _decoders.get(plan.name)
        if decoders is None:
            decoders = _learned(conn.dialect, plan, cursor.description)
    return _decoded(plan, decoders, row)


def _bound(plan: Prepared, params: Mapping[str, Any]) -> tuple[Any, ...]:
    """The statement's values in order, as SQLAlchemy would bind them."""
    values = list(plan.order({**plan.constants, **params} if plan.constants else params))
    for i in plan.utc_values:
        # As UtcDateTime binds them: aware only (psycopg2 sends the offset along).
        if values[i] is not None and values[i].tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
    for i in plan.uuid_values:
        # As its text, which the PREPAREd parameter's type reads: psycopg2's adapter of
        # a UUID costs three Python calls a value.
        if values[i] is not None:
            values[i] = str(values[i])
    for i, encode, none in plan.encoders:
        values[i] = none if values[i] is None else encode(values[i])
    return tuple(values)


def _decoded(plan: Prepared, decoders: Processors, row: tuple[Any, ...]) -> Row:
    """The row as SQLAlchemy would read it, by column name."""
    found = list(row)
    for i in plan.utc_columns:
        # As UtcDateTime reads them: psycopg2's aware datetimes, in UTC.
        at = found[i]
        if at is not None and at.tzinfo is not UTC:
            found[i] = at.astimezone(UTC)
    for i, decode in decoders:
        if found[i] is not None:
            found[i] = decode(found[i])
    return dict(zip(plan.columns, found, strict=True))


def _learned(dialect: Dialect, plan: Prepared, description: Any) -> Processors:
    kinds = (d[1] for d in description)
    decoders = tuple(
        (i, decode)
        for i, (type_, kind) in enumerate(zip(plan.types, kinds, strict=True))
        if i not in plan.utc_columns
        and (decode := type_._cached_result_processor(dialect, kind)) is not None
    )
    _decoders[plan.name] = decoders
    return decoders


def _usable(conn: Connection) -> bool:
    return (
        conn.dialect.driver == "psycopg2" and is_autocommit(conn) and conn.engine not in _unprepared
    )


def _ensure(conn: Connection, plan: Prepared) -> None:
    done: set[str] = conn.connection.info.setdefault(_INFO_KEY, set())
    if plan.name not in done:
        conn.exec_driver_sql(plan.prepare)
        done.add(plan.name)


def _positions(types: list[TypeEngine[Any]], kind: type[TypeEngine[Any]]) -> tuple[int, ...]:
    return tuple(i for i, t in enumerate(types) if isinstance(t, kind))


@cache
def _prepared(stmt: Select[Any], dialect: Dialect) -> Prepared:
    # The same dialect with $n placeholders: the text PREPARE needs.
    numbered = type(dialect)(paramstyle="numeric_dollar")  # type: ignore[call-arg]
    compiled = stmt.compile(dialect=numbered)
    names = list(compiled.positiontup or ())
    binds = [compiled.binds[n] for n in names]
    types = ", ".join(numbered.type_compiler_instance.process(b.type) for b in binds)
    name = "jobsapp_" + hashlib.sha256(f"{types}|{compiled.string}".encode()).hexdigest()[:20]
    bind_types = [b.type for b in binds]
    utc_values = _positions(bind_types, UtcDateTime)
    uuid_values = _positions(bind_types, Uuid)
    encoders = tuple(
        (i, encode, encode(None))
        for i, t in enumerate(bind_types)
        if i not in utc_values + uuid_values
        and (encode := t._cached_bind_processor(dialect)) is not None
    )
    # Constants the statement carries (a state literal) keep their values; the caller's
    # named parameters stay required, as in the statement itself.
    constants = {n: b.effective_value for n, b in zip(names, binds, strict=True) if b.unique}
    result_types = [c.type for c in stmt.selected_columns]
    return Prepared(
        name=name,
        prepare=f"PREPARE {name} ({types}) AS {compiled.string}",
        execute=f"EXECUTE {name}({', '.join(['%s'] * len(names))})",
        order=_getter(names),
        constants=constants,
        encoders=encoders,
        utc_values=utc_values,
        uuid_values=uuid_values,
        columns=tuple(str(c.key) for c in stmt.selected_columns),
        types=tuple(result_types),
        utc_columns=_positions(result_types, UtcDateTime),
    )


def _getter(names: list[str]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """The values of ``names`` as a tuple, in one C call (``itemgetter`` of one name
    returns the value itself)."""
    if len(names) == 1:
        one = names[0]
        return lambda params: (params[one],)
    return itemgetter(*names)
