"""A task no worker registered: Celery's answer for a plain call, the journal's patience for
a job it already keeps.

The in-process worker of tests/conftest.py stands for a worker that lacks a task: the task's
strategy is taken out of its consumer (what ``celery worker`` builds from the tasks it
imported), and put back for a worker that has it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery.exceptions import NotRegistered
from celery.result import AsyncResult
from celery.signals import task_unknown
from sqlalchemy import Engine

from jobsapp import operator
from jobsapp.celery_app import app
from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.maintenance import relay
from jobsapp.settings import get_settings
from tests.support import tasks
from tests.support.journal_view import run_row, transitions
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(120)

UNCLAIMED_AFTER = 0.5
NOBODY = "tests.nobody_registered"


@pytest.fixture
def quick_relay(monkeypatch: pytest.MonkeyPatch) -> Iterator[relay.RelayConfig]:
    """A message unclaimed for half a second is republished by the next relay pass."""
    monkeypatch.setenv("JOBSAPP_UNCLAIMED_AFTER", str(UNCLAIMED_AFTER))
    get_settings.cache_clear()
    yield relay.RelayConfig(unclaimed_after=timedelta(seconds=UNCLAIMED_AFTER))
    get_settings.cache_clear()


def strategies(worker: Any) -> dict[str, Any]:
    found: dict[str, Any] = worker.consumer.strategies
    return found


def test_send_task_of_a_name_no_worker_registered_fails_with_not_registered_as_celerys(
    worker: object, db: Engine
) -> None:
    heard: list[tuple[str, str]] = []

    def unknown(sender: Any, name: str, id: str, **_: Any) -> None:
        heard.append((name, id))

    task_unknown.connect(unknown)
    try:
        r = app.send_task(NOBODY, ("x",), {"n": 1})
        with pytest.raises(NotRegistered) as failed:
            r.get(timeout=30)
        eventually(lambda: heard)  # Celery fires it after the failure is stored
    finally:
        task_unknown.disconnect(unknown)

    assert failed.value.args == (NOBODY,)
    assert AsyncResult(r.id, app=app).state == "FAILURE"
    assert heard == [(NOBODY, r.id)]
    # Kept where an operator finds it, with the call that a replay would run.
    row = run_row(db, uuid.UUID(r.id))
    assert (row["state"], row["outcome"], row["task_name"]) == ("failed", "unregistered", NOBODY)
    assert row["params"] == {"args": ["x"], "kwargs": {"n": 1}}
    assert transitions(db, uuid.UUID(r.id)) == ["claim", "fail"]


def test_its_replay_runs_the_call_once_a_worker_knows_the_task(
    worker: object, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = uuid.uuid4().hex[:8]
    with monkeypatch.context() as older:
        older.delitem(strategies(worker), tasks.echo.name)
        r = app.send_task(tasks.echo.name, (token,))
        with pytest.raises(NotRegistered):
            r.get(timeout=30)

    operator.replay(db, JOBS.module, uuid.UUID(r.id), actor="ops", reason="deployed", app=app)
    again: AsyncResult[Any] = AsyncResult(r.id, app=app)  # r keeps the failure it read
    assert again.get(timeout=30) is None
    assert again.state == "SUCCESS"
    assert tasks.calls(token) == 1


def test_a_job_the_journal_keeps_waits_for_a_worker_that_knows_its_task(
    worker: object,
    db: Engine,
    monkeypatch: pytest.MonkeyPatch,
    quick_relay: relay.RelayConfig,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A rolling deploy: the producer knows the task, a worker does not yet. Its message
    (and a plain copy of the same call) are refused, never failed; the relay sends the
    job again until a worker that knows the task runs it."""
    token = uuid.uuid4().hex[:8]
    refused = "unregistered task 'tests.echo'"
    with monkeypatch.context() as older, caplog.at_level(logging.ERROR):
        older.delitem(strategies(worker), tasks.echo.name)
        job = tasks.echo.delay(token)
        eventually(lambda: caplog.text.count(refused) == 1)
        app.send_task(tasks.echo.name, (token,), task_id=job.id)
        eventually(lambda: caplog.text.count(refused) == 2)
        assert job.state == "PENDING"
        assert run_row(db, job.job_id)["state"] == "queued"

    def relayed_and_done() -> bool:
        relay.run_once(app, db, quick_relay)  # what beat does every JOBSAPP_RELAY_EVERY
        return bool(run_row(db, job.job_id)["state"] == "succeeded")

    eventually(relayed_and_done, timeout=30, interval=0.5)
    assert tasks.calls(token) == 1
