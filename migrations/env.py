"""Alembic environment: one schema for PostgreSQL and SQLite, from jobsapp's models."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from jobsapp.db import get_engine
from jobsapp.lifecycle.journal.ddl import CALLERS_TRANSACTION, lock_timeout_statement
from jobsapp.schema import metadata

config = context.config


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def _run(connection: Connection) -> None:
    # Handed over inside its caller's transaction, Alembic can leave it for no concurrent
    # index build (ddl.build_index).
    connection.info[CALLERS_TRANSACTION] = connection.in_transaction()
    _configure(connection)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # LOCAL, as every SET of jobsapp's (PgBouncer's transaction pooling would hand a
            # session's setting to another client); ddl.build_index sets it again after the
            # commit its concurrent build makes.
            context.execute(lock_timeout_statement())
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or None
    with get_engine(url).connect() as conn:
        _run(conn)
        conn.commit()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run against a database")
run_migrations_online()
