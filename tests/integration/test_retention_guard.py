"""Retention never deletes a finished run inside a task's dedup window: it refuses to run.

A finished run is what absorbs a repeated enqueue of its job id; deleted inside the window,
the same work would run again. The pass is called directly on planted rows, with an app
whose registered tasks declare the windows (the default app declares none this long).
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import pytest
from celery import Celery
from sqlalchemy import Engine, select, update

from jobsapp.db import utcnow
from jobsapp.lifecycle import journal, lifecycle_task
from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.journal.tables import JobRun
from jobsapp.maintenance import retention
from tests.support import tasks

RUNS = JobRun.__table__
DAY = timedelta(days=1)


def app_with_window(window: timedelta) -> Celery:
    app = Celery("retention-guard-tests", set_as_current=False)

    # A name of its own: task names are checked for uniqueness across apps.
    name = f"guard.windowed.{uuid.uuid4().hex[:8]}"

    # Not shared: Celery would add a shared task to every app, the default one included.
    @lifecycle_task(app, name=name, dedup_window=window.total_seconds(), shared=False)
    def windowed(token: str) -> None:
        del token

    return app


@pytest.fixture
def finished_8_days_ago(db: Engine) -> uuid.UUID:
    job = tasks.echo.new_job(("m",), {}, uuid.uuid4())
    with db.begin() as conn:
        journal.enqueue(conn, job, now=utcnow() - 9 * DAY, actor="test")
        conn.execute(
            update(RUNS)
            .where(RUNS.c.job_id == job.job_id)
            .values(state="succeeded", finished_at=utcnow() - 8 * DAY)
        )
    return job.job_id


def run_ids(db: Engine) -> set[uuid.UUID]:
    with db.connect() as conn:
        return set(conn.execute(select(RUNS.c.job_id)).scalars())


def test_a_window_longer_than_the_retention_deletes_nothing_and_says_why(
    db: Engine, finished_8_days_ago: uuid.UUID, caplog: pytest.LogCaptureFixture
) -> None:
    app = app_with_window(10 * DAY)

    with pytest.raises(retention.RetentionRefused, match=r"task guard\.windowed\.\w+ absorbs"):
        retention.run_once(db, retention.RetentionConfig(), app)

    assert finished_8_days_ago in run_ids(db)
    (line,) = [r for r in caplog.records if r.name == retention.__name__]
    assert line.levelno == logging.ERROR
    assert "retention refused" in line.getMessage()
    assert "kept 7 days" in line.getMessage()
    assert "for 10 days" in line.getMessage()


def test_a_window_within_the_retention_lets_the_pass_run(
    db: Engine, finished_8_days_ago: uuid.UUID
) -> None:
    counts = retention.run_once(db, retention.RetentionConfig(), app_with_window(7 * DAY))

    assert counts[registry.JOBS.module] == 1
    assert finished_8_days_ago not in run_ids(db)


def test_the_default_app_registers_no_window_beyond_the_default_retention() -> None:
    from jobsapp.celery_app import app

    windows = retention.dedup_windows(app)
    # Its task modules are imported for the check: the attachment task is among them.
    assert "jobsapp.attachments.process" in windows
    assert retention.refusal(retention.RetentionConfig().runs, windows) is None


def test_the_refusal_names_the_longest_window() -> None:
    windows = {"a": DAY, "b": 3 * DAY, "c": timedelta(0)}
    assert retention.refusal(3 * DAY, windows) is None
    assert retention.refusal(2 * DAY, {}) is None
    reason = retention.refusal(2 * DAY, windows)
    assert reason is not None
    assert "task b" in reason
    assert "3 days" in reason
