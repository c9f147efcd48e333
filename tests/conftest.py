"""Shared fixtures: migrated databases per dialect, a clean journal per test, a worker."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.support.env import (
    HYPOTHESIS_PROFILE,
    SESSION,
    VAR_DIR,
    configure_process_env,
    service,
)
from tests.support.servers import RedisServer

configure_process_env()

from alembic import command  # noqa: E402 - jobsapp must see the test environment first
from hypothesis import settings  # noqa: E402
from sqlalchemy import Engine, create_engine, text  # noqa: E402

from jobsapp.celery_app import app  # noqa: E402
from jobsapp.db import get_engine  # noqa: E402
from jobsapp.settings import get_settings  # noqa: E402
from jobsapp.shipped import alembic_config  # noqa: E402

pytest_plugins = ("celery.contrib.pytest", "tests.support.shape")

# The suite that gates landing draws the same examples on every run and machine: a case
# nobody wrote cannot fail a submission by luck. Random exploration is a separate run,
# HYPOTHESIS_PROFILE=explore (README, "Tests"); pin what it finds with @example.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(HYPOTHESIS_PROFILE)

app.conf.task_default_queue = f"jobsapp-tests-{SESSION}"

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


def _fresh_postgres(admin_url: str, name: str) -> str:
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
def migrated_postgres(name: str) -> Iterator[str]:
    """A fresh database ``name`` with jobsapp's migrations, dropped afterwards."""
    admin_url = service("JOBSAPP_TEST_DATABASE_URL")
    url = _fresh_postgres(admin_url, name)
    migrate(url)
    try:
        yield url
    finally:
        get_engine(url).dispose()
        _drop_postgres(admin_url, name)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with migrated_postgres(f"jobsapp_tests_{SESSION}") as url:
        yield url


def _drop_postgres(admin_url: str, name: str) -> None:
    admin = create_engine(admin_url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def sqlite_url() -> str:
    url = f"sqlite:///{VAR_DIR}/lifecycle-tests.db"
    migrate(url)
    return url


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
    )


@pytest.fixture(params=["postgres", "sqlite"])
def db(request: pytest.FixtureRequest) -> Engine:
    """The lifecycle conformance suite runs on both dialects."""
    url = request.getfixturevalue(f"{request.param}_url")
    return use_database(url)


@pytest.fixture
def pg(postgres_url: str) -> Engine:
    return use_database(postgres_url)


@pytest.fixture
def redis_clean() -> None:
    """Empty the test counters and the broker queue, keeping kombu's bindings."""
    import redis

    client = redis.Redis.from_url(service("JOBSAPP_TEST_REDIS_URL"))
    doomed = [*client.scan_iter(f"jobsapp-test:{SESSION}:*"), *client.scan_iter("jobsapp:dedup:*")]
    client.delete(app.conf.task_default_queue, *doomed)


@pytest.fixture(scope="module")
def module_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A ``redis-server`` of this module's own, empty at its start: the broker, dedup keys
    and counters of the processes a module starts (``.url``), killable at will."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), dies_with_pytest=True)
    server.start()
    yield server
    server.close()


@pytest.fixture
def worker(db: Engine, redis_clean: None) -> Iterator[object]:
    """An in-process Celery worker (threads pool, 2 slots) on the Redis broker."""
    from tests.support.workers import in_process_worker

    with in_process_worker() as w:
        yield w
