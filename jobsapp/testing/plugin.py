"""jobsapp's pytest plugin (the ``pytest11`` entry point of ``jobsapp[testing]``).

With no database, broker or storage named in the environment, the session runs on the
embedded default in a temporary folder of its own (SQLite, kombu's filesystem transport, a
local directory), set before your modules import jobsapp's app; with ``JOBSAPP_DATABASE_URL``
and the others set, on those. The ``jobsapp`` fixture migrates the journal once, empties it
before each test and gives the test a ``Kit``; ``jobsapp_worker`` adds a real Celery worker
(threads pool, in this process) on the same journal and broker.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from jobsapp.settings import SERVER_NAMES

_MIGRATED: set[str] = set()


def pytest_configure(config: pytest.Config) -> None:
    del config
    if not any(os.environ.get(name) for name in SERVER_NAMES) and not os.environ.get(
        "JOBSAPP_VAR_DIR"
    ):
        os.environ["JOBSAPP_VAR_DIR"] = tempfile.mkdtemp(prefix="jobsapp-tests-")


@pytest.fixture
def jobsapp() -> Any:
    """A test kit on a journal emptied for this test (jobsapp.testing.Kit)."""
    from alembic import command

    from jobsapp.celery_app import app
    from jobsapp.settings import get_settings
    from jobsapp.shipped import alembic_config
    from jobsapp.testing.kit import Kit

    url = get_settings().database_url
    if url not in _MIGRATED:
        command.upgrade(alembic_config(), "head")
        _MIGRATED.add(url)
    kit = Kit(app)
    kit.reset()
    return kit


@pytest.fixture
def jobsapp_worker(jobsapp: Any) -> Iterator[Any]:
    """A real Celery worker (threads pool, in this process) on the kit's journal and broker."""
    from celery.contrib.testing.worker import start_worker

    with start_worker(jobsapp.app, pool="threads", concurrency=2, perform_ping_check=False):
        yield jobsapp
