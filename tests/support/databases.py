"""Test databases: a fresh Postgres database per name (dropped after), migrated to head,
and a clean journal in the process's configured database. Import after
``tests.support.env.configure_process_env()`` (tests/conftest.py does) so jobsapp reads
the test environment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from alembic import command
from sqlalchemy import Engine, create_engine, text

from jobsapp.db import get_engine
from jobsapp.settings import get_settings
from jobsapp.shipped import alembic_config
from tests.support.env import SESSION, service

TABLES_IN_DELETE_ORDER = (
    "job_events",
    "outbox",
    "leases",
    "key_slots",
    "job_runs",
    "workflow_steps",
    "run_counts",
    "workflow_counts",
)


def migrate(url: str) -> None:
    cfg = alembic_config()
    cfg.set_main_option("sqlalchemy.url", url)
    command.upgrade(cfg, "head")


def fresh_postgres(admin_url: str, name: str) -> str:
    # Sessions (xdist workers, colleagues) share one Postgres: a name without the session's
    # mark would be dropped under another session running the same module.
    assert SESSION in name, f"database {name!r}: put SESSION in the name (tests/README.md)"
    admin = create_engine(admin_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


@contextmanager
def migrated_postgres(name: str, *, migrated: bool = True) -> Iterator[str]:
    """A fresh database ``name`` with jobsapp's migrations (or none), dropped afterwards."""
    admin_url = service("JOBSAPP_TEST_DATABASE_URL")
    url = fresh_postgres(admin_url, name)
    try:
        if migrated:
            migrate(url)
        yield url
    finally:
        get_engine(url).dispose()
        drop_postgres(admin_url, name)


def drop_postgres(admin_url: str, name: str) -> None:
    admin = create_engine(admin_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def use_database(url: str) -> Engine:
    """Make ``url`` the process's configured database and empty its journal."""
    os.environ["JOBSAPP_DATABASE_URL"] = url
    get_settings.cache_clear()
    engine = get_engine(url)
    with engine.begin() as conn:
        for table in TABLES_IN_DELETE_ORDER + extra_tables():
            conn.execute(text(f"DELETE FROM {table}"))
        # The finish counts start again with their tables (journal/finished_counts.py).
        conn.execute(text("DELETE FROM maintenance_counters WHERE name LIKE 'run_counts_%'"))
    return engine


def extra_tables() -> tuple[str, ...]:
    """Domain tables that exist once their migrations do, children first."""
    return (
        "attachment_variants",
        "attachment_runs",
        "attachments",
        "reprocess_runs",
        "flow_pauses",
        "flow_actions",
        "flow_rates",
        "web_sessions",
        # The charts' minutes: a chart test reads what it made, not an earlier test's runs.
        "chart_minutes",
    )
