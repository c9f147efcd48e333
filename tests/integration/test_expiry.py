"""Celery's ``expires`` on lifecycle tasks: a job still queued at its expiry never runs.

Against the real Postgres (and SQLite for the worker's side), Redis, and the in-process
worker of tests/conftest.py; the reaper's side with no worker at all.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from celery import states as celery_states
from sqlalchemy import Engine

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.rules.states import Outcome, State, Transition
from jobsapp.maintenance import reaper
from tests.support import tasks
from tests.support.journal_view import run_row, transitions
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(120)


def _noop() -> None:
    """A body that is never run here: what the call writes is the answer."""


def _ended(engine: Engine, handle: JobHandle) -> bool:
    return run_row(engine, handle.job_id)["state"] == State.FAILED.value


@pytest.mark.usefixtures("worker")
def test_a_job_delivered_after_its_expiry_never_runs_and_ends_expired(db: Engine) -> None:
    token = uuid.uuid4().hex
    handle = tasks.echo.apply_async(
        kwargs={"token": token}, expires=datetime.now(UTC) - timedelta(seconds=1)
    )
    assert isinstance(handle, JobHandle)
    eventually(lambda: _ended(db, handle))
    row = run_row(db, handle.job_id)
    assert (row["outcome"], row["attempts"], row["started_at"]) == (Outcome.EXPIRED, 0, None)
    assert tasks.calls(token) == 0
    assert transitions(db, handle.job_id) == [Transition.ENQUEUE, Transition.EXPIRE]
    # Celery marks an expired task REVOKED; so does the handle.
    assert handle.state == celery_states.REVOKED


@pytest.mark.usefixtures("worker")
def test_a_job_within_its_expiry_runs_and_its_retry_keeps_the_same_expiry(db: Engine) -> None:
    token = uuid.uuid4().hex
    handle = tasks.flaky.apply_async(
        kwargs={"token": token, "fail_times": 1, "secret": "s"}, expires=60
    )
    assert isinstance(handle, JobHandle)
    expires_at = run_row(db, handle.job_id)["expires_at"]
    before = datetime.now(UTC)
    assert before + timedelta(seconds=50) < expires_at <= before + timedelta(seconds=60)
    handle.settled(timeout=30)
    row = run_row(db, handle.job_id)
    assert (row["state"], row["attempts"], row["expires_at"]) == ("succeeded", 2, expires_at)
    assert handle.state == celery_states.SUCCESS


def test_a_tasks_own_expires_is_every_calls_and_a_calls_own_wins(db: Engine) -> None:
    # Celery gives each call its task's expires (its messages carry it); a call's wins.
    short = lifecycle_task(app, name="tests.expiry.short_lived", expires=60)(_noop)
    before = datetime.now(UTC)
    expires_at = run_row(db, short.delay().job_id)["expires_at"]
    assert before + timedelta(seconds=50) < expires_at <= before + timedelta(seconds=61)
    own = run_row(db, short.apply_async(expires=3600).job_id)["expires_at"]
    assert own > before + timedelta(seconds=3000)
    assert run_row(db, tasks.echo.delay("none").job_id)["expires_at"] is None


def test_the_reaper_expires_a_queued_job_whose_message_never_came(pg: Engine) -> None:
    # No worker: the message waits in the broker; the reaper ends the run at its expiry.
    token = uuid.uuid4().hex
    handle = tasks.echo.apply_async(kwargs={"token": token}, expires=0.5)
    assert isinstance(handle, JobHandle)
    cfg = reaper.ReaperConfig(stale_after=timedelta(seconds=30))
    reaper.run_once(pg, cfg)
    assert run_row(pg, handle.job_id)["state"] == State.QUEUED.value  # not yet expired

    def expired() -> bool:
        reaper.run_once(pg, cfg)
        return _ended(pg, handle)

    eventually(expired)
    row = run_row(pg, handle.job_id)
    assert row["outcome"] == Outcome.EXPIRED
    assert transitions(pg, handle.job_id) == [Transition.ENQUEUE, Transition.EXPIRE]
    assert tasks.calls(token) == 0
