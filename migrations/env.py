"""Alembic environment: one schema for PostgreSQL and SQLite, from jobsapp's models."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from jobsapp.db import get_engine
from jobsapp.lifecycle.journal.ddl import MIGRATION_LOCK_TIMEOUT_S
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
    _configure(connection)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Session-wide: it outlasts the commits of an index built concurrently (ddl.py).
            context.execute(f"SET lock_timeout = '{MIGRATION_LOCK_TIMEOUT_S}s'")
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
