"""Shared fixtures: migrated databases per dialect, a clean journal per test, a worker."""

from __future__ import annotations

import logging
from collections.abc import Iterator

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

from hypothesis import settings  # noqa: E402
from sqlalchemy import Engine  # noqa: E402

from jobsapp.celery_app import app  # noqa: E402 - jobsapp must see the test environment first
from tests.support.databases import migrate, migrated_postgres, use_database  # noqa: E402

pytest_plugins = ("celery.contrib.pytest", "tests.support.shape")

# The suite that gates landing draws the same examples on every run and machine: a case
# nobody wrote cannot fail a submission by luck. Random exploration is a separate run,
# HYPOTHESIS_PROFILE=explore (README, "Tests"); pin what it finds with @example.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(HYPOTHESIS_PROFILE)

app.conf.task_default_queue = f"jobsapp-tests-{SESSION}"


@pytest.fixture(autouse=True)
def root_log_level() -> Iterator[None]:
    """Each test starts with the root logger's level as pytest set it: an in-process Celery
    worker's set-up leaves it at the worker's (ERROR), and every later test's WARNING was
    then dropped before ``caplog`` could see it."""
    level = logging.root.level
    yield
    logging.root.setLevel(level)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with migrated_postgres(f"jobsapp_tests_{SESSION}") as url:
        yield url


@pytest.fixture(scope="session")
def sqlite_url() -> str:
    url = f"sqlite:///{VAR_DIR}/lifecycle-tests.db"
    migrate(url)
    return url


@pytest.fixture(params=["postgres", "sqlite"])
def db(request: pytest.FixtureRequest) -> Engine:
    """The lifecycle conformance suite runs on both dialects."""
    url = request.getfixturevalue(f"{request.param}_url")
    return use_database(url)


@pytest.fixture
def pg(postgres_url: str) -> Engine:
    return use_database(postgres_url)


@pytest.fixture
def lease_check_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``LeasedScheduler`` made in a test makes its lease renewal every maintenance pass's
    in this process (``budget.guard_with``): taken back after the test, so a later pass
    neither renews a lease for a scheduler gone nor stops at another test's lease."""
    from jobsapp.maintenance import budget

    monkeypatch.setattr(budget, "_lease_check", budget._lease_check)


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
