"""Transitions that take several statements are all-or-nothing, even when the process dies."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from jobsapp.db import autocommit, utcnow
from jobsapp.lifecycle import EnqueueOutcome, journal
from jobsapp.lifecycle.registry import JOBS
from jobsapp.lifecycle.states import State, Transition
from tests.e2e.procs import Launcher, service_env
from tests.support import tasks
from tests.support.journal_view import outbox_rows, run_row


@pytest.fixture
def launcher(postgres_url: str, tmp_path: Path) -> Iterator[Launcher]:
    env = service_env(database_url=postgres_url, broker_url=os.environ["JOBSAPP_BROKER_URL"],
                      var_dir=tmp_path, settings={})  # fmt: skip
    started = Launcher(env, tmp_path)
    yield started
    started.kill_all()


def _finished_job(pg: Engine) -> uuid.UUID:
    """A tests.echo job (no dedup window) that ran its one attempt and succeeded."""
    handle = tasks.echo.apply_async(("r",))
    with pg.begin() as conn:
        assert journal.claim(conn, JOBS, handle.job_id, 1, worker="w:1", now=utcnow())
        assert journal.succeed(conn, JOBS, handle.job_id, 1, actor="w:1", now=utcnow())
    return handle.job_id


def test_a_producer_killed_mid_rerun_leaves_the_finished_job_rerunnable(
    pg: Engine, launcher: Launcher
) -> None:
    job_id = _finished_job(pg)
    again = {"task": "tests.echo", "job_id": job_id, "kwargs": {"token": "r"}}
    producer = launcher.producer([again], crash_at="reopen_after_update")
    assert producer.wait(30) == -9, producer.log()
    # All or nothing: still the finished run, not a queued row that no message will start.
    row = run_row(pg, job_id)
    assert (row["state"], row["attempts"]) == ("succeeded", 1)
    assert [r["attempt"] for r in outbox_rows(pg, job_id)] == [1]
    rerun = tasks.echo.apply_async(("r",), job_id=job_id)
    assert rerun.outcome == EnqueueOutcome.ENQUEUED
    assert [r["attempt"] for r in outbox_rows(pg, job_id)] == [1, 2]


def test_a_rerun_on_an_autocommit_connection_is_refused(pg: Engine) -> None:
    job_id = _finished_job(pg)
    with autocommit(pg) as conn, pytest.raises(RuntimeError, match="transaction"):
        journal.reopen(
            conn, JOBS, job_id, from_state=State.SUCCEEDED, attempts=1, budget=1,
            transition=Transition.RERUN, now=utcnow(), actor="t", reason="again",
        )  # fmt: skip
    assert run_row(pg, job_id)["state"] == "succeeded"
