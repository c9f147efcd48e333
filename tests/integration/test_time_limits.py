"""Celery's time limits on lifecycle tasks (issue 30): the same bodies and options on a bare
Celery app (Redis broker and result backend) and as lifecycle tasks (Postgres journal),
each on a real prefork worker subprocess."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import TimeLimitExceeded
from sqlalchemy import Engine
from sqlalchemy.exc import NoResultFound

from jobsapp.celery_app import app
from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.rules.states import State, Transition
from tests.support import bare_time_limits as bare
from tests.support import time_limit_tasks as ours
from tests.support.env import SESSION
from tests.support.journal_view import events, run_row
from tests.support.procs import BIN, WORKER_FLAGS, Launcher, launching, ready
from tests.support.time_limit_bodies import HANG_SECONDS, TIME_LIMIT, started
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
BARE_QUEUE = f"bare-time-limits-{SESSION}"
LIMIT_ERROR = "billiard.exceptions.TimeLimitExceeded"  # celery.exceptions re-exports it


@pytest.fixture(scope="module")
def workers(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    """One prefork worker of each app, started together (the start is the slow part)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JOBSAPP_DATABASE_URL": postgres_url,
        "JOBSAPP_IMPORTS": "tests.support.tasks,tests.support.time_limit_tasks",
        bare.QUEUE: BARE_QUEUE,
    }
    with launching(env, tmp_path_factory.mktemp("time-limits")) as launcher:
        name = uuid.uuid4().hex[:6]
        jobsapp_worker = launcher.start(
            "worker",
            [
                str(BIN / "celery"),
                "-A",
                "jobsapp",
                "worker",
                *WORKER_FLAGS,
                "-Q",
                app.conf.task_default_queue,
                "-n",
                f"limits-{name}@%h",
            ],
        )
        bare_worker = launcher.start(
            "bare",
            [
                str(BIN / "celery"),
                "-A",
                "tests.support.bare_time_limits",
                "worker",
                *WORKER_FLAGS,
                "-n",
                f"bare-limits-{name}@%h",
            ],
        )
        ready(jobsapp_worker, bare_worker, timeout=90)
        yield launcher


def _token(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def _handle(value: object) -> JobHandle:
    assert isinstance(value, JobHandle)
    return value


def _ended(db: Engine, handle: JobHandle, timeout: float = 40.0) -> dict[str, Any]:
    """The run once it is no longer queued or running."""

    def done() -> dict[str, Any] | None:
        row = dict(run_row(db, handle.job_id))
        return row if row["state"] not in (State.QUEUED, State.RUNNING) else None

    return eventually(done, timeout=timeout)


def _failure_types(db: Engine, handle: JobHandle) -> dict[str, str]:
    """Each failed attempt's stored exception type, by its transition."""
    return {
        e["transition"]: e["detail"]["type"]
        for e in events(db, handle.job_id)
        if e["detail"] is not None
    }


@pytest.mark.usefixtures("redis_clean")
def test_a_hard_time_limit_kills_the_child_and_records_time_limit_exceeded(
    workers: Launcher, pg: Engine
) -> None:
    theirs, token = _token("bare-hang"), _token("hang")
    with pytest.raises(TimeLimitExceeded):
        bare.hang.apply_async((theirs,), queue=BARE_QUEUE).get(timeout=30)
    began = time.monotonic()
    # The run keeps its queue: the worker's retry goes to this session's queue too.
    handle = _handle(ours.hang.apply_async((token,), queue=app.conf.task_default_queue))
    row = _ended(pg, handle)
    # Each attempt was killed at its limit, not when its body woke: retried once, failed.
    assert time.monotonic() - began < 2 * HANG_SECONDS
    assert started(theirs) == 1
    assert started(token) == 2
    assert (row["state"], row["outcome"], row["attempts"]) == ("failed", "exhausted", 2)
    assert "TimeLimitExceeded" in str(row["last_error"])
    assert _failure_types(pg, handle) == {
        Transition.RETRY: LIMIT_ERROR,
        Transition.FAIL: LIMIT_ERROR,
    }


@pytest.mark.usefixtures("redis_clean")
def test_a_time_limit_given_to_one_call_bounds_every_attempt_of_its_job(
    workers: Launcher, pg: Engine
) -> None:
    """Celery's ``apply_async(time_limit=...)``: the retry's message carries it too, so the
    prefork pool kills both attempts of a task that has no limit of its own."""
    token = _token("per-call")
    handle = _handle(
        ours.hang_per_call.apply_async(
            (token,), time_limit=TIME_LIMIT, queue=app.conf.task_default_queue
        )
    )
    row = _ended(pg, handle)
    # Each attempt ended TimeLimitExceeded: killed at the call's limit (a body left to wake
    # would have succeeded); how long that took is the loaded machine's, not asserted here.
    assert started(token) == 2
    assert (row["state"], row["outcome"], row["attempts"]) == ("failed", "exhausted", 2)
    assert (row["time_limit"], row["soft_time_limit"]) == (TIME_LIMIT, None)
    assert _failure_types(pg, handle) == {
        Transition.RETRY: LIMIT_ERROR,
        Transition.FAIL: LIMIT_ERROR,
    }


@pytest.mark.parametrize("limit", [-1, 10**9, "soon"])
def test_a_time_limit_out_of_range_is_refused_at_the_call(pg: Engine, limit: object) -> None:
    job_id = uuid.uuid4()
    with pytest.raises(ValueError, match="time_limit must be between 0 and"):
        ours.hang_per_call.apply_async(("never",), job_id=job_id, time_limit=limit)
    with pytest.raises(NoResultFound):
        run_row(pg, job_id)


@pytest.mark.usefixtures("redis_clean")
def test_a_soft_time_limit_is_raised_in_the_body(workers: Launcher, pg: Engine) -> None:
    theirs, token = _token("bare-soft"), _token("soft")
    assert bare.soft.apply_async((theirs,), queue=BARE_QUEUE).get(timeout=30) == "cleaned up"
    row = _ended(pg, _handle(ours.soft.delay(token)))
    assert (row["state"], row["result"], row["attempts"]) == ("succeeded", "cleaned up", 1)
    assert started(theirs) == started(token) == 1


def test_under_the_threads_pool_the_journal_ends_a_body_past_its_hard_limit(
    worker: object, pg: Engine
) -> None:
    """Celery cannot stop a thread; the heartbeat ends the attempt at the limit, as
    TimeLimitExceeded, and interrupts a body that runs Python."""
    token = _token("spin")
    handle = _handle(ours.spin.delay(token, 30.0))
    began = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        handle.get(timeout=30)
    assert time.monotonic() - began < 10
    row = run_row(pg, handle.job_id)
    assert (row["state"], row["outcome"], row["attempts"]) == ("failed", "exhausted", 1)
    assert _failure_types(pg, handle) == {Transition.FAIL: LIMIT_ERROR}


def test_the_limit_frees_the_key_of_a_body_that_still_hangs(worker: object, pg: Engine) -> None:
    token = _token("keyed")
    first = _handle(ours.hang_keyed.delay(token, 8.0))
    eventually(lambda: run_row(pg, first.job_id)["state"] == State.FAILED, timeout=10)
    # The body sleeps on in its thread; its key is free, so the next job of the key runs.
    second = _handle(ours.hang_keyed.delay(token, 0.0))
    assert second.outcome.value == "enqueued"
    assert second.get(timeout=20) == "woke"
