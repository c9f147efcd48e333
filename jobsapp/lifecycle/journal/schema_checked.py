"""A journal statement that met a missing table, or one its role may not use, raises the
processes' one line.

A database never migrated (or behind) or a role granted nothing fails a write or a read
with the driver's error, its SQL and the job's arguments; every jobsapp process says
instead what ``jobsapp db upgrade`` or a ``GRANT`` would fix.
"""

from __future__ import annotations

from types import TracebackType

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from jobsapp.lifecycle.rules.errors import DatabaseNotMigrated, DatabaseNotPermitted
from jobsapp.settings import get_settings


class SchemaChecked:
    """A journal statement that met a missing table because the database was never
    migrated (or is behind) raises DatabaseNotMigrated with the processes' line, not the
    SQL; one that met a table its role may not use, DatabaseNotPermitted.

    The revision is read on a connection of its own, after our transaction ended. Inside
    a caller's SQLite transaction the raw error stays: a second connection would wait
    for that transaction's write lock. (A class, not a generator: every ``.delay()``
    enters it, and a generator's context manager costs twice the Python calls.)
    """

    def __init__(self, callers: Connection | None = None) -> None:
        self._callers = callers

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, _kind: object, error: BaseException | None, _trace: TracebackType | None
    ) -> None:
        if not isinstance(error, DBAPIError):
            return
        if self._callers is not None and self._callers.dialect.name == "sqlite":
            return
        from jobsapp import preflight  # only on this path: it loads Alembic

        failure = preflight.journal_unusable(error, get_settings().database_url)
        if failure is None:
            return
        if failure.code == preflight.ExitCode.DATABASE_NOT_PERMITTED:
            raise DatabaseNotPermitted(failure.line) from None
        raise DatabaseNotMigrated(failure.line) from None
