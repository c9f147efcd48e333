"""Engines for the system of record: PostgreSQL in production, SQLite embedded.

SQLite serialises writers; every transaction here begins with ``BEGIN IMMEDIATE`` so two
writers queue on the busy timeout instead of deadlocking when a read lock is upgraded.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, DateTime, Engine, create_engine, event
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.types import TypeDecorator

from jobsapp.held import Holder
from jobsapp.settings import get_settings

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()
_autocommit_engines: set[Engine] = set()
# Per variant engine's key in ``_engines``, its threads' held connections.
_holders: dict[str, Holder] = {}
# Per engine (weakly: tests make many), its variants by name, each with its threads'
# held connections.
_variants: weakref.WeakKeyDictionary[Engine, dict[str, Holder]] = weakref.WeakKeyDictionary()
_VARIANT_POOL = 5
# How long an SQLite writer queues for the write lock, unless its caller bounds it.
_BUSY_TIMEOUT_MS = 30000
# The execution option by which a relaxed connection bounds its statements (milliseconds).
_BOUND_OPTION = "jobsapp_bound_ms"


class UtcDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on both dialects (SQLite stores them naive, in UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(
        self,
        value: datetime | None,
        dialect: Dialect,  # noqa: ARG002 - SQLAlchemy's signature
    ) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


def _sqlite_connect(dbapi_conn: Any, _record: ConnectionPoolEntry) -> None:
    # pysqlite's own transaction handling is switched off so that BEGIN IMMEDIATE is ours.
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    # FULL: a commit (an upload answered 202) survives a power loss; NORMAL in WAL mode
    # may lose the last transactions (docs/lifecycle.md).
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.close()


def _sqlite_begin(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str) -> Engine:
    """A new engine; SQLite gets WAL, a busy timeout and immediate transactions."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    # No pre-ping (a round trip per checkout): a dropped connection invalidates the pool
    # when it is first used, and callers treat that error as transient.
    return create_engine(url, pool_size=5, max_overflow=10)


def get_engine(url: str | None = None) -> Engine:
    """The process-wide engine for ``url`` (default: the configured database)."""
    url = url or get_settings().database_url
    with _engines_lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = make_engine(url)
        return engine


def _variant_of(engine: Engine, name: str) -> Holder:
    """The ``name`` variant of ``engine`` with its held connections, found without a lock
    or a URL rendering once made (two per job on a worker's hot path)."""
    known = _variants.get(engine)
    if known is None:
        known = _variants[engine] = {}
    variant = known.get(name)
    if variant is None:
        url = engine.url.render_as_string(hide_password=False)
        variant = known[name] = _variant(url, name)
    return variant


def _variant(url: str, name: str) -> Holder:
    key = f"{name}:{url}"
    with _engines_lock:
        holder = _holders.get(key)
        if holder is None:
            # No rollback when a connection goes back to the pool: in autocommit there is
            # no transaction to end (a statement's SET LOCAL ended with it).
            engine = _engines[key] = create_engine(
                url,
                pool_size=_VARIANT_POOL,
                max_overflow=10,
                isolation_level="AUTOCOMMIT",
                pool_reset_on_return=None,
            )
            _autocommit_engines.add(engine)
            if name == "relaxed":
                event.listen(engine, "before_cursor_execute", _without_flush_wait, retval=True)
            holder = _holders[key] = Holder(engine, cap=_VARIANT_POOL)
        return holder


# Sent in the statement's own Query message: psycopg2 sends one simple query, which
# PostgreSQL runs as one implicit transaction, so the setting ends with that statement's
# commit. No round trip, and nothing left on a server connection PgBouncer shares.
_NO_FLUSH_WAIT = "SET LOCAL synchronous_commit TO off; "


def _without_flush_wait(
    conn: Connection,
    _cursor: Any,
    statement: str,
    parameters: Any,
    _context: Any,
    _executemany: bool,
) -> tuple[str, Any]:
    # The connection's options, not the statement's context: a prepared statement's
    # EXECUTE (journal/prepared.py) runs without one.
    bound = conn.get_execution_options().get(_BOUND_OPTION)
    if bound is None:
        return _NO_FLUSH_WAIT + statement, parameters
    # Local too, so the bound ends with the statement and never reaches a pooled session.
    timeouts = f"SET LOCAL lock_timeout TO {bound}; SET LOCAL statement_timeout TO {bound}; "
    return _NO_FLUSH_WAIT + timeouts + statement, parameters


def console_engine(url: str | None = None) -> Engine:
    """The engine of the console's and the API's queries: on PostgreSQL each transaction
    runs at most ``JOBSAPP_CONSOLE_TIMEOUT`` seconds (``SET LOCAL statement_timeout``, as
    it begins: nothing stays on a server connection PgBouncer shares), so a slow search
    answers 503 instead of holding a web worker. A pool of its own: the workers' engine
    never pays for the listener."""
    base = get_engine(url)
    if base.dialect.name != "postgresql":
        return base
    key = f"console:{base.url.render_as_string(hide_password=False)}"
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = create_engine(base.url, pool_size=5, max_overflow=10)
            event.listen(engine, "begin", _bound_transaction)
        return engine


def _bound_transaction(conn: Connection) -> None:
    bound = max(1, round(get_settings().console_timeout * 1000))
    conn.exec_driver_sql(f"SET LOCAL statement_timeout TO {bound}")


def get_relaxed_engine(url: str | None = None) -> Engine:
    """For writes whose loss is harmless (an outbox row's published mark): the ordinary
    engine, whose caller relaxes its own transaction with ``SET LOCAL synchronous_commit``.
    Not a startup option or a session ``SET``: PgBouncer's transaction pooling refuses the
    one and would hand the other to every client of the same server connection."""
    return get_engine(url)


def autocommit(engine: Engine) -> AbstractContextManager[Connection]:
    """A connection on which every statement commits by itself, for paths that are ONE
    statement (on PostgreSQL the hot transitions, each compiled into one statement).

    It saves the BEGIN and COMMIT round trips (and a per-checkout isolation switch). A
    path of two or more writes must use ``engine.begin()``: here a crash between them
    would commit the first alone; the journal refuses such paths on this connection.
    SQLite keeps its immediate transaction. On PostgreSQL the thread's held connection
    (jobsapp/held.py), not a generator around it: two per job on a worker's hot path.
    """
    if engine.dialect.name != "postgresql":
        return engine.begin()
    return _variant_of(engine, "autocommit").use()


def relaxed_autocommit(
    engine: Engine, bound: float | None = None
) -> AbstractContextManager[Connection]:
    """``autocommit`` whose commits do not wait for the WAL flush (PostgreSQL), for
    writes whose loss a later synchronous commit or the fence repairs: claims and
    heartbeats (docs/lifecycle.md, "Claims and heartbeats do not wait for the flush").

    With ``bound`` (seconds) each statement waits at most that long for a lock and for
    its own execution (SQLite: for the write lock), then fails.
    """
    if engine.dialect.name == "sqlite" and bound is not None:
        return _sqlite_bounded(engine, bound)
    if engine.dialect.name != "postgresql":
        return autocommit(engine)
    relaxed = _variant_of(engine, "relaxed")
    if bound is None:
        return relaxed.use()
    # A checkout of its own: the bound is an option of the connection, not to be held.
    conn = relaxed.engine.connect()
    conn.execution_options(**{_BOUND_OPTION: max(1, round(bound * 1000))})
    return conn


@contextmanager
def relaxed_transaction(engine: Engine) -> Iterator[Connection]:
    """``engine.begin()`` whose commit does not wait for the WAL flush (PostgreSQL), for a
    transaction of several writes a crash may lose as a whole: an opted-in success that
    also starts workflow steps or frees a key's slot (docs/lifecycle.md). ``SET LOCAL``
    ends with the transaction: nothing stays on a server connection PgBouncer shares."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SET LOCAL synchronous_commit TO off")
        yield conn


@contextmanager
def _sqlite_bounded(engine: Engine, bound: float) -> Iterator[Connection]:
    """An immediate transaction whose wait for the write lock is ``bound``; the pooled
    connection gets the ordinary busy timeout back."""
    with engine.connect() as conn:
        # On the DBAPI cursor: a statement through ``conn`` would begin the transaction
        # (and wait for the lock) before the timeout is set.
        cursor = conn.connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={max(1, round(bound * 1000))}")
        try:
            with conn.begin():
                yield conn
        finally:
            cursor.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
            cursor.close()


def is_autocommit(conn: Connection) -> bool:
    return conn.engine in _autocommit_engines


def dispose_engines() -> None:
    """Forget pooled connections, e.g. in a forked worker child."""
    with _engines_lock:
        for engine in _engines.values():
            engine.dispose(close=False)


def lock_refused(exc: DBAPIError) -> bool:
    """PostgreSQL gave up waiting for a lock (``lock_timeout``, SQLSTATE 55P03)."""
    return getattr(exc.orig, "pgcode", None) == "55P03"


# PostgreSQL's SQLSTATE for a privilege the role lacks (insufficient_privilege).
INSUFFICIENT_PRIVILEGE = "42501"


def privilege_refused(exc: DBAPIError) -> bool:
    """PostgreSQL refused the statement: the role lacks a privilege it needs."""
    return getattr(exc.orig, "pgcode", None) == INSUFFICIENT_PRIVILEGE
