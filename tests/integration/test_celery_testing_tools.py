"""Celery's own testing tools on lifecycle tasks, as a Celery team's suite uses them:
``celery.contrib.testing.worker.start_worker(app)`` with Celery's defaults (the solo pool and
its ``celery.ping`` check), the same calls on a bare Celery app (Redis result backend) first.
A team's pytest run with Celery's fixtures and jobsapp's plugin together is
tests/e2e/test_testing_plugin.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import celery.contrib.testing.tasks  # noqa: F401 - celery.ping, which start_worker sends
import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from sqlalchemy import Engine

from jobsapp.celery_app import app
from tests.support import first_hour_tasks as hour
from tests.support.env import SESSION, service
from tests.support.journal_view import run_row

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def bare() -> Iterator[Celery]:
    url = service("JOBSAPP_TEST_REDIS_URL")
    celery = Celery("bare-start-worker", broker=url, backend=url)
    celery.conf.task_default_queue = f"bare-start-worker-{SESSION}"
    celery.task(name="bare.start_worker.add")(hour._add)
    celery.task(name="bare.start_worker.refuse")(hour._refuse)
    try:
        yield celery
    finally:
        app.set_current()
        app.set_default()


def test_start_worker_with_its_ping_check_runs_calls_as_on_bare_celery(
    pg: Engine, redis_clean: None, bare: Celery
) -> None:
    """The check is ``celery.ping.delay().get() == "pong"``: on jobsapp's app, whose plain
    tasks keep no result, it failed with a bare ``AssertionError`` before any test ran."""
    token = f"start-worker-{uuid.uuid4().hex[:8]}"
    with start_worker(bare):
        assert bare.tasks["bare.start_worker.add"].delay(2, 3).get(timeout=10) == 5
        with pytest.raises(ValueError, match=f"no way, bare-{token}"):
            bare.tasks["bare.start_worker.refuse"].delay(f"bare-{token}").get(timeout=10)
    with start_worker(app):
        handle = hour.add.delay(2, 3)
        assert handle.get(timeout=10) == 5
        with pytest.raises(ValueError, match=f"no way, {token}"):
            hour.refuse.delay(token).get(timeout=20)
    assert run_row(pg, uuid.UUID(handle.id))["state"] == "succeeded"
