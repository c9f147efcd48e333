"""jobsapp's pytest plugin (the ``pytest11`` entry point of ``jobsapp[testing]``).

Where the session's journal lives, decided before your ``conftest.py`` files are loaded
(one that imports your tasks imports jobsapp's app, which reads its settings once):

- ``JOBSAPP_DATABASE_URL`` and the other server URLs set: on those, as named.
- else ``JOBSAPP_TEST_DATABASE_URL`` set (a PostgreSQL URL): a database of the session's
  own on that server, ``<its database>_kit_<pid>`` (so xdist workers and parallel runs
  never meet), created at the session's start and dropped at its end; the broker and
  storage are the embedded ones in a temporary folder.
- else the embedded default in a temporary folder (SQLite, kombu's filesystem transport,
  a local directory).

The journal is migrated once, before the session's first test (what Celery's own fixtures
and a test without the kit use too); the ``jobsapp`` fixture empties it before each test and
gives the test a ``Kit``; ``jobsapp_worker`` adds a real Celery worker (threads pool, in this
process) on the same journal and broker.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from jobsapp.settings import EMBEDDED_BROKER, SERVER_NAMES

_OWN_DATABASE = "JOBSAPP_TEST_DATABASE_URL"
# The settings this plugin set in this process's environment, which its children inherit.
_SET_HERE = "JOBSAPP_TEST_KIT_SET"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> Iterator[None]:
    # Before any conftest.py (and any other plugin's own hook): a conftest that imports
    # the team's tasks builds jobsapp's app, which reads the settings once. Decided later,
    # the session's journal was the working directory's var/ (the team's own embedded
    # journal, emptied before each test), shared by every xdist worker.
    _choose_journal(early_config)
    return (yield)


def pytest_configure(config: pytest.Config) -> None:
    del config
    from celery.contrib.testing.worker import test_worker_started, test_worker_stopped

    from jobsapp.testing import beside

    test_worker_started.connect(beside.worker_started, weak=False)
    test_worker_stopped.connect(beside.worker_stopped, weak=False)


def _choose_journal(config: pytest.Config) -> None:
    from jobsapp.settings import get_settings

    if get_settings.cache_info().currsize:
        raise pytest.UsageError(
            "jobsapp's settings were read before its pytest plugin chose the session's "
            "journal (a plugin imported jobsapp's app): import it from conftest.py or the tests"
        )
    # A session started by another (an xdist worker by its controller) inherits what the
    # other set for itself: dropped first, so each session has a journal of its own.
    for name in filter(None, os.environ.pop(_SET_HERE, "").split(",")):
        os.environ.pop(name, None)
    if any(os.environ.get(name) for name in SERVER_NAMES):
        return
    settings = {"JOBSAPP_VAR_DIR": os.environ.get("JOBSAPP_VAR_DIR", "")}
    if not settings["JOBSAPP_VAR_DIR"]:
        settings["JOBSAPP_VAR_DIR"] = tempfile.mkdtemp(prefix="jobsapp-tests-")
    given = os.environ.get(_OWN_DATABASE)
    if given:
        server = _server_url(given)
        url = _create_session_database(server)
        config.add_cleanup(lambda: _drop_session_database(server, url))
        settings |= {
            "JOBSAPP_DATABASE_URL": url,
            "JOBSAPP_BROKER_URL": EMBEDDED_BROKER,
            "JOBSAPP_STORAGE_URL": f"file://{settings['JOBSAPP_VAR_DIR']}/storage",
        }
    mine = [name for name in settings if name not in os.environ]
    os.environ.update(settings)
    os.environ[_SET_HERE] = ",".join(mine)


def pytest_report_header(config: pytest.Config) -> str:
    del config
    from jobsapp.settings import SettingsError, get_settings

    try:
        url = get_settings().database_url
    except SettingsError as exc:
        return f"jobsapp: {exc}"
    return f"jobsapp: journal on {make_url(url).render_as_string(hide_password=True)}"


def _session_url(server: str) -> Any:
    refusal = f"{_OWN_DATABASE} must be a PostgreSQL URL naming a database, not {server!r}"
    try:
        given = make_url(server)
    except ArgumentError:
        raise pytest.UsageError(refusal) from None
    if given.get_backend_name() != "postgresql" or not given.database:
        raise pytest.UsageError(refusal)
    return given.set(database=f"{given.database}_kit_{os.getpid()}")


def _server_url(given: str) -> str:
    """``given`` on psycopg2, as jobsapp's own URL is (SQLAlchemy would pick psycopg 3 for
    ``postgresql://``, which jobsapp does not install)."""
    from jobsapp.settings import SettingsError, with_psycopg2

    try:
        return with_psycopg2(given, _OWN_DATABASE)
    except SettingsError as exc:
        raise pytest.UsageError(str(exc)) from None


def _create_session_database(server: str) -> str:
    """A fresh database of this session's own beside the one ``server`` names (a leftover
    of a killed session with the same process id is dropped first)."""
    url = _session_url(server)
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{url.database}"'))
    finally:
        admin.dispose()
    return str(url.render_as_string(hide_password=False))


def _drop_session_database(server: str, url: str) -> None:
    from jobsapp.db import get_engine

    get_engine(url).dispose()
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))
    finally:
        admin.dispose()


@pytest.fixture(scope="session", autouse=True)
def jobsapp_journal() -> None:
    """The session's journal, migrated before the first test's own fixtures: Celery's
    ``celery_session_worker`` (session-scoped, so set up before a test's ``jobsapp``) and a
    test that asks for no kit at all (``start_worker(app)``, ``task_always_eager``,
    ``celery_worker``) use it too. Before, their worker's start-up check stopped the test
    with "database not migrated"."""
    from alembic import command

    from jobsapp.shipped import alembic_config

    command.upgrade(alembic_config(), "head")


@pytest.fixture
def jobsapp() -> Any:
    """A test kit on a journal emptied for this test (jobsapp.testing.Kit)."""
    from jobsapp.celery_app import app
    from jobsapp.testing.kit import Kit

    kit = Kit(app)
    kit.reset()
    return kit


@pytest.fixture
def jobsapp_worker(jobsapp: Any) -> Iterator[Any]:
    """A real Celery worker (threads pool, in this process) on the kit's journal and broker."""
    from celery.contrib.testing.worker import start_worker

    with start_worker(jobsapp.app, pool="threads", concurrency=2, perform_ping_check=False):
        yield jobsapp
