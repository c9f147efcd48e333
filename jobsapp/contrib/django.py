"""Enqueue inside Django's ``transaction.atomic()``: one transaction, published on commit.

``enqueue(task, args)`` writes the run row and the outbox row through the Django
connection of ``using``, inside the caller's transaction (a savepoint when one is open),
and publishes from ``transaction.on_commit``. Django alone begins, commits and rolls back:
the SQLAlchemy connection it lends to the journal never ends a transaction nor closes the
socket. A rolled-back atomic block (or savepoint) leaves no row and no message.

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
from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import NullPool

from jobsapp.lifecycle.enqueue import Batch
from jobsapp.lifecycle.handle import JobHandle
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


class BorrowedPsycopg2(PGDialect_psycopg2):
    """PostgreSQL over psycopg2 on a connection Django owns: Django alone ends the
    transaction (COMMIT, ROLLBACK) and closes the socket."""

    supports_statement_cache = True  # SQLAlchemy asks each dialect class to say so itself

    def do_commit(self, dbapi_connection: DBAPIConnection) -> None:
        pass

    def do_rollback(self, dbapi_connection: DBAPIConnection) -> None:
        pass

    def do_close(self, dbapi_connection: DBAPIConnection) -> None:
        pass


registry.register("postgresql.django_psycopg2", __name__, "BorrowedPsycopg2")

_engines: dict[str, Engine] = {}
_engines_lock = threading.Lock()


@contextmanager
def _borrowed(using: str) -> Iterator[Connection]:
    """A SQLAlchemy connection over Django's, inside the atomic block already open."""
    with _engine(using).connect() as conn:
        yield conn


def _engine(using: str) -> Engine:
    _check_driver(connections[using].connection)
    with _engines_lock:
        engine = _engines.get(using)
        if engine is None:
            engine = _engines[using] = create_engine(
                "postgresql+django_psycopg2://",
                # Called in the enqueuing thread: Django's connections are per thread.
                creator=lambda: connections[using].connection,
                poolclass=NullPool,
            )
        return engine


def _check_driver(dbapi_connection: object) -> None:
    # Django prefers psycopg 3 when it is installed; jobsapp speaks psycopg2 only.
    module = type(dbapi_connection).__module__
    if not module.startswith("psycopg2"):
        raise TypeError(
            f"jobsapp.contrib.django needs Django on PostgreSQL through psycopg2, got {module}"
        )
