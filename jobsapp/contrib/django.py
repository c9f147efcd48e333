"""Enqueue inside Django's ``transaction.atomic()``: one transaction, published on commit.

``enqueue(task, args)`` writes the run row and the outbox row through the Django
connection of ``using``, inside the caller's transaction (a savepoint when one is open),
and publishes from ``transaction.on_commit``. Django alone begins, commits and rolls back:
the SQLAlchemy connection the journal gets over Django's (psycopg 3 or psycopg2) never ends
a transaction nor closes the socket. A rolled-back atomic block (or savepoint) leaves no
row and no message.

The Django database and ``JOBSAPP_DATABASE_URL`` must be the same PostgreSQL database:
workers, the relay and the published mark use the latter.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction  # type: ignore[import-untyped]
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import NullPool

from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.producer.enqueue import Batch
from jobsapp.lifecycle.task import LifecycleTask

__all__ = ["enqueue"]


def enqueue(
    task: LifecycleTask,
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    job_id: uuid.UUID | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> JobHandle:
    """Enqueue ``task`` in the current Django transaction of ``using``; publish on commit.

    Outside ``atomic()`` the enqueue is its own transaction, published at once.
    """
    with transaction.atomic(using=using), _borrowed(using) as conn:
        batch = Batch(conn)
        handle = task.enqueue_in(batch, args, kwargs, job_id=job_id)
        # robust: once the rows are committed, a failure here (Redis for the dedup mark,
        # say) must not fail the caller; the relay publishes what the fast path did not.
        transaction.on_commit(lambda: batch.publish(task.app), using=using, robust=True)
    return handle


class _Borrowed:
    """Dialect mixin: the DBAPI connection is Django's; Django alone ends its transaction
    (COMMIT, ROLLBACK) and closes it."""

    def do_commit(self, dbapi_connection: DBAPIConnection) -> None:
        pass

    def do_rollback(self, dbapi_connection: DBAPIConnection) -> None:
        pass

    def do_close(self, dbapi_connection: DBAPIConnection) -> None:
        pass


class BorrowedPsycopg2(_Borrowed, PGDialect_psycopg2):
    supports_statement_cache = True  # SQLAlchemy asks each dialect class to say so itself


class BorrowedPsycopg(_Borrowed, PGDialect_psycopg):
    """psycopg 3: Django's choice when it is installed."""

    supports_statement_cache = True

    def on_connect(self) -> None:
        # The stock hook adds a notice handler at every connect: on one borrowed connection
        # that is one more handler per enqueue.
        return None


registry.register("postgresql.django_psycopg2", __name__, "BorrowedPsycopg2")
registry.register("postgresql.django_psycopg", __name__, "BorrowedPsycopg")

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


@contextmanager
def _borrowed(using: str) -> Iterator[Connection]:
    """A SQLAlchemy connection over Django's, inside the atomic block already open."""
    with _engine(using).connect() as conn:
        yield conn


def _engine(using: str) -> Engine:
    driver = _driver(connections[using].connection)
    with _engines_lock:
        engine = _engines.get(using)
        if engine is None:
            engine = _engines[using] = create_engine(
                f"postgresql+django_{driver}://",
                # Called in the enqueuing thread: Django's connections are per thread.
                creator=lambda: connections[using].connection,
                poolclass=NullPool,
            )
        return engine


def _driver(dbapi_connection: object) -> str:
    module = type(dbapi_connection).__module__.split(".")[0]
    if module not in ("psycopg2", "psycopg"):
        raise TypeError(f"jobsapp.contrib.django needs Django on PostgreSQL, got {module}")
    return module
