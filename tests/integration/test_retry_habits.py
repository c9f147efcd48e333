"""Celery's retry habits on lifecycle tasks answer as Celery does (issue 36): the same body
and options on a bare Celery app (Redis result backend, in-process worker) and as a
lifecycle task (in-process worker, Postgres/SQLite journal), one after the other: two
in-process workers cannot share a process."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.exceptions import MaxRetriesExceededError
from sqlalchemy import Engine

from jobsapp.celery_app import app
from tests.support import retry_habit_tasks as habits
from tests.support.env import SESSION, service
from tests.support.journal_view import run_row
from tests.support.tasks import calls
from tests.support.workers import in_process_worker

pytestmark = pytest.mark.timeout(90)


@contextmanager
def bare_worker() -> Iterator[dict[str, Any]]:
    url = service("JOBSAPP_TEST_REDIS_URL")
    celery = Celery("bare-retry-habits", broker=url, backend=url)
    celery.conf.task_default_queue = f"bare-retry-habits-{SESSION}"
    tasks = habits.declare_bare(celery)
    try:
        with start_worker(celery, pool="threads", concurrency=2, perform_ping_check=False):
            yield tasks
    finally:
        app.set_current()
        app.set_default()


def _token(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def _ours(db: Engine, name: str, token: str) -> dict[str, object]:
    with in_process_worker():
        handle = habits.LIFECYCLE[name].delay(token)
        handle.settled(timeout=30)
    return dict(run_row(db, handle.job_id))


def test_autoretry_for_retries_only_the_exceptions_it_lists(db: Engine, redis_clean: None) -> None:
    theirs = _token("bare-unlisted")
    with bare_worker() as bare, pytest.raises(ValueError, match="not a listed exception"):
        bare["unlisted"].delay(theirs).get(timeout=20)
    token = _token("unlisted")
    row = _ours(db, "unlisted", token)
    assert calls(theirs) == calls(token) == 1
    assert (row["state"], row["attempts"]) == ("failed", 1)
    assert "ValueError: not a listed exception" in str(row["last_error"])


def test_a_retry_calls_own_max_retries_ends_in_max_retries_exceeded(
    db: Engine, redis_clean: None
) -> None:
    theirs = _token("bare-bounded")
    with bare_worker() as bare, pytest.raises(MaxRetriesExceededError):
        bare["bounded"].delay(theirs).get(timeout=20)
    token = _token("bounded")
    row = _ours(db, "bounded", token)
    assert calls(theirs) == calls(token) == 2
    assert (row["state"], row["outcome"], row["attempts"]) == ("failed", "exhausted", 2)
    assert "MaxRetriesExceededError" in str(row["last_error"])


def test_a_retry_at_an_eta_runs_again_no_sooner(db: Engine, redis_clean: None) -> None:
    theirs = _token("bare-eta")
    with bare_worker() as bare:
        assert bare["at_eta"].delay(theirs).get(timeout=20) == "ran again"
    token = _token("eta")
    row = _ours(db, "at_eta", token)
    assert (row["state"], row["attempts"], row["result"]) == ("succeeded", 2, "ran again")
    for each in (theirs, token):
        first, second = habits.STARTS[each]
        assert second - first >= habits.ETA_SECONDS - 0.2, (each, second - first)
