"""``app.control.revoke`` of lifecycle jobs, kept in the journal.

A queued job never runs; a running one is stopped at its next heartbeat and ends
cancelled with nothing published; a worker started after the revoke still honours it.
Against the real Postgres and Redis, the in-process worker and a real worker subprocess.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from celery import states as celery_states
from celery.app.task import Context
from sqlalchemy import Engine

from jobsapp.celery_app import app
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.celery_api.backend import for_app as backend_for
from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.lifecycle.rules.message import task_id_for
from jobsapp.lifecycle.rules.states import Outcome, State, Transition
from jobsapp.maintenance import reaper
from jobsapp.settings import get_settings
from tests.support import tasks
from tests.support.journal_view import events, run_row, transitions
from tests.support.procs import BIN, WORKER_FLAGS, Launcher, Proc, launching, ready
from tests.support.waiting import eventually
from tests.support.workers import in_process_worker

pytestmark = pytest.mark.timeout(180)


def _handle(value: object) -> JobHandle:
    assert isinstance(value, JobHandle)
    return value


def _state(engine: Engine, handle: JobHandle) -> str:
    return str(run_row(engine, handle.job_id)["state"])


def _assert_cancelled_unrun(engine: Engine, handle: JobHandle, token: str) -> None:
    row = run_row(engine, handle.job_id)
    assert (row["state"], row["outcome"], row["started_at"]) == ("failed", "cancelled", None)
    assert transitions(engine, handle.job_id) == [Transition.ENQUEUE, Transition.CANCEL]
    assert events(engine, handle.job_id)[-1]["actor"] == "revoke"  # the audit row
    assert tasks.calls(token) == 0
    assert handle.state == celery_states.REVOKED


@pytest.mark.usefixtures("redis_clean")
def test_a_revoked_queued_job_never_runs(pg: Engine) -> None:
    token, after = uuid.uuid4().hex, uuid.uuid4().hex
    revoked = _handle(tasks.echo.delay(token))
    app.control.revoke(revoked.id)
    assert _state(pg, revoked) == State.FAILED
    # One slot and a FIFO queue: the revoked job's message is taken before the next one's.
    with in_process_worker(concurrency=1):
        _handle(tasks.echo.delay(after)).settled(timeout=30)
    _assert_cancelled_unrun(pg, revoked, token)


@pytest.mark.usefixtures("worker")
def test_a_revoked_running_job_is_stopped_at_its_next_beat(db: Engine) -> None:
    token = uuid.uuid4().hex
    running = _handle(tasks.looping.delay(token, 60.0))
    eventually(lambda: tasks.calls(token) == 1 and _state(db, running) == State.RUNNING)
    app.control.revoke(running.id, terminate=True)  # the threads pool cannot terminate
    row = running.settled(timeout=30)
    assert (row["state"], row["outcome"]) == (State.FAILED, Outcome.CANCELLED)
    seen = transitions(db, running.job_id)
    assert seen == [
        Transition.ENQUEUE,
        Transition.CLAIM,
        Transition.CANCEL_REQUEST,
        Transition.CANCEL,
    ]
    assert Transition.SUCCEED not in seen
    assert tasks.calls(f"{token}-done") == 0  # the body was stopped, not left to finish
    assert running.state == celery_states.REVOKED


@pytest.fixture
def subprocesses(pg: Engine, redis_clean: None, tmp_path: Path) -> Iterator[Launcher]:
    """Real workers on this session's services and counters."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with launching(env, tmp_path) as launcher:
        yield launcher


def _worker(launcher: Launcher, name: str) -> Proc:
    """``celery -A jobsapp worker`` on this session's queue, ready."""
    worker = launcher.start(
        name,
        [
            str(BIN / "celery"),
            "-A",
            "jobsapp",
            "worker",
            *WORKER_FLAGS,
            "-Q",
            app.conf.task_default_queue,
            "-n",
            f"{name}-{uuid.uuid4().hex[:6]}@%h",
        ],
    )
    ready(worker, timeout=60)
    return worker


def test_a_worker_restart_between_revoke_and_delivery_does_not_forget_it(
    subprocesses: Launcher, pg: Engine
) -> None:
    first = _worker(subprocesses, "revoke-a")
    _handle(tasks.echo.delay(uuid.uuid4().hex)).settled(timeout=30)
    first.kill()  # down: Celery's broadcast of the revoke reaches no worker
    token, after = uuid.uuid4().hex, uuid.uuid4().hex
    revoked = _handle(tasks.echo.delay(token))
    app.control.revoke(revoked.id)
    _worker(subprocesses, "revoke-b")
    # One prefork child and a FIFO queue: the revoked message is taken before this one.
    _handle(tasks.echo.delay(after)).settled(timeout=30)
    assert tasks.calls(after) == 1
    _assert_cancelled_unrun(pg, revoked, token)


@pytest.mark.usefixtures("redis_clean")
def test_a_revoked_run_whose_worker_died_is_failed_cancelled_by_the_reaper(pg: Engine) -> None:
    token = uuid.uuid4().hex
    running = _handle(tasks.echo.delay(token))
    with pg.begin() as conn:  # a worker claims it, then dies without a beat
        assert journal.claim(conn, JOBS, running.job_id, 1, worker="gone:1") is not None
    app.control.revoke(running.id)
    cfg = reaper.ReaperConfig(stale_after=timedelta(milliseconds=1))

    def reaped() -> bool:
        reaper.run_once(pg, cfg)
        return _state(pg, running) == State.FAILED

    eventually(reaped)
    assert run_row(pg, running.job_id)["outcome"] == Outcome.CANCELLED  # not requeued
    # Its history says cancelled too, by the reaper (metrics and domain rows read it).
    assert transitions(pg, running.job_id) == [
        Transition.ENQUEUE,
        Transition.CLAIM,
        Transition.CANCEL_REQUEST,
        Transition.CANCEL,
    ]
    assert events(pg, running.job_id)[-1]["actor"] == "reaper"


@pytest.mark.usefixtures("worker")
def test_a_revoke_broadcast_past_the_journal_cancels_the_run_its_worker_discards(
    db: Engine,
) -> None:
    """``celery control revoke <id>`` broadcasts straight to the workers (a revoke made
    before the job's enqueue committed reaches only them too): the worker discards the
    job's first attempt, whose task id is the job's, and the journal must agree, or the
    relay publishes the run again and again."""
    token, job_id = uuid.uuid4().hex, uuid.uuid4()

    def listed() -> bool:
        # Sent again until the worker lists it: a broadcast before its mailbox is up is lost.
        app.control.broadcast("revoke", arguments={"task_id": str(job_id)})
        replies = app.control.inspect(timeout=1).revoked() or {}
        return any(str(job_id) in ids for ids in replies.values())

    eventually(listed, timeout=20)
    revoked = _handle(tasks.echo.apply_async((token,), job_id=job_id))
    eventually(lambda: _state(db, revoked) == State.FAILED, timeout=20)
    _assert_cancelled_unrun(db, revoked, token)


def test_a_workers_discard_during_a_database_outage_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Celery's worker calls mark_as_revoked in its consumer: an outage must not reach it
    (the relay's next publish is discarded, and its cancel tried, again)."""
    monkeypatch.setenv("JOBSAPP_DATABASE_URL", "postgresql+psycopg2://postgres@127.0.0.1:9/none")
    get_settings.cache_clear()
    try:
        job_id = uuid.uuid4()
        with caplog.at_level(logging.WARNING, logger="jobsapp.lifecycle.celery_api.revoke"):
            backend_for(app).mark_as_revoked(str(job_id), "revoked", request=Context(retries=0))
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
    assert f"job {job_id}: revoke not recorded (OperationalError)" in caplog.text


# ------------------------------------------------- an attempt's own task id (Flower's)


@pytest.mark.usefixtures("redis_clean")
def test_an_attempts_task_id_revokes_its_queued_job(pg: Engine) -> None:
    """The id Flower lists for a received attempt, sent by its revoke button."""
    token, after = uuid.uuid4().hex, uuid.uuid4().hex
    revoked = _handle(tasks.echo.delay(token))
    app.control.revoke(task_id_for(revoked.job_id, 1))
    assert _state(pg, revoked) == State.FAILED
    with in_process_worker(concurrency=1):
        _handle(tasks.echo.delay(after)).settled(timeout=30)
    _assert_cancelled_unrun(pg, revoked, token)


@pytest.mark.usefixtures("worker")
def test_a_running_attempts_task_id_stops_its_job(db: Engine) -> None:
    token = uuid.uuid4().hex
    running = _handle(tasks.looping.delay(token, 60.0))
    eventually(lambda: tasks.calls(token) == 1 and _state(db, running) == State.RUNNING)
    app.control.revoke(task_id_for(running.job_id, 1), terminate=True)
    row = running.settled(timeout=30)
    assert (row["state"], row["outcome"]) == (State.FAILED, Outcome.CANCELLED)
    assert tasks.calls(f"{token}-done") == 0


@pytest.mark.usefixtures("redis_clean")
def test_an_earlier_attempts_task_id_names_the_job_queued_for_its_retry(pg: Engine) -> None:
    """A retried attempt's id (RETRY in Flower) revokes the job's next, queued attempt."""
    queued = _handle(tasks.echo.delay(uuid.uuid4().hex))
    with pg.begin() as conn:
        assert journal.claim(conn, JOBS, queued.job_id, 1, worker="w:1")
        run = journal.load(conn, JOBS, queued.job_id)
        assert run is not None
        assert journal.requeue(
            conn, JOBS, run, error="later", transition=Transition.RETRY, actor="w:1"
        )
    app.control.revoke(task_id_for(queued.job_id, 1))
    row = run_row(pg, queued.job_id)
    assert (row["state"], row["outcome"], row["attempts"]) == ("failed", "cancelled", 1)


@pytest.mark.usefixtures("redis_clean")
def test_a_task_id_that_names_no_active_job_changes_nothing(pg: Engine) -> None:
    done = _handle(tasks.echo.delay(uuid.uuid4().hex))
    app.control.revoke(task_id_for(uuid.uuid4(), 1))
    assert _state(pg, done) == State.QUEUED
