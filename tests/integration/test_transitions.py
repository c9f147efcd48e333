"""Transitions that take several statements are all-or-nothing, even when the process dies."""

from __future__ import annotations

import dataclasses
import time
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from jobsapp import operator
from jobsapp.celery_app import app
from jobsapp.db import autocommit, make_engine, utcnow
from jobsapp.lifecycle import EnqueueOutcome, journal
from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.lifecycle.rules.errors import LeaseLost
from jobsapp.lifecycle.rules.message import Envelope
from jobsapp.lifecycle.rules.states import State, Transition
from jobsapp.lifecycle.worker import claim
from jobsapp.lifecycle.worker.heartbeat import Heartbeat
from jobsapp.maintenance import relay
from tests.support import tasks
from tests.support.journal_view import events, held_by, outbox_rows, run_count, run_row, transitions
from tests.support.procs import Launcher
from tests.support.waiting import eventually


def _finished_job(pg: Engine) -> uuid.UUID:
    """A tests.echo job (no dedup window) that ran its one attempt and succeeded."""
    handle = tasks.echo.apply_async(("r",))
    with pg.begin() as conn:
        assert journal.claim(conn, JOBS, handle.job_id, 1, worker="w:1", now=utcnow())
        assert journal.succeed(
            conn,
            JOBS,
            handle.job_id,
            1,
            actor="w:1",
            now=utcnow(),
            token=held_by(conn, JOBS, handle.job_id),
        )
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
            conn,
            JOBS,
            job_id,
            from_state=State.SUCCEEDED,
            attempts=1,
            budget=1,
            transition=Transition.RERUN,
            now=utcnow(),
            actor="t",
            reason="again",
        )
    assert run_row(pg, job_id)["state"] == "succeeded"


def _envelope(job_id: uuid.UUID, attempt: int, outbox_id: int | None = None) -> Envelope:
    return Envelope(job_id, "jobs", attempt, outbox_id, None, {}, None)


def test_a_message_that_comes_a_little_early_waits_and_claims(db: Engine) -> None:
    # A countdown is counted on the publisher's clock: by the database's it may be early.
    handle = tasks.echo.apply_async(("early",), countdown=1.0)
    (message,) = outbox_rows(db, handle.job_id)
    started = time.monotonic()
    env = _envelope(handle.job_id, 1, message["id"])
    taken = claim.claim(db, JOBS, env, foreign=None, worker="w:1", wait_early=3.0)
    assert isinstance(taken, claim.Claimed)
    assert time.monotonic() - started >= 0.5
    too_early = tasks.echo.apply_async(("later",), countdown=30.0)
    env = _envelope(too_early.job_id, 1, outbox_rows(db, too_early.job_id)[0]["id"])
    assert (
        claim.claim(db, JOBS, env, foreign=None, worker="w:1", wait_early=3.0)
        is claim.Refusal.EARLY
    )


def test_the_second_copy_of_a_foreign_message_is_a_duplicate_not_a_key_conflict(
    db: Engine,
) -> None:
    job = tasks.tick.new_job((), {}, uuid.uuid4())
    env = _envelope(job.job_id, 1)
    assert isinstance(claim.claim(db, JOBS, env, foreign=job, worker="w:1"), claim.Claimed)
    # The losing copy saw no row, then lost the insert to the first copy.
    with db.begin() as conn:
        assert claim._claim_foreign(conn, job, env, "w:2") is claim.Refusal.IN_FLIGHT
    assert [e["transition"] for e in events(db, job.job_id)] == ["claim"]


def test_a_foreign_message_for_an_attempt_never_scheduled_is_refused(db: Engine) -> None:
    job = dataclasses.replace(tasks.tick.new_job((), {}, uuid.uuid4()), max_attempts=3)
    refused = claim.claim(db, JOBS, _envelope(job.job_id, 7), foreign=job, worker="w:1")
    assert refused is claim.Refusal.AHEAD
    assert run_count(db) == 0


def test_cancel_is_fenced_by_the_attempt_the_operator_saw(db: Engine) -> None:
    handle = tasks.echo.apply_async(("c",))
    with db.begin() as conn:
        assert journal.claim(conn, JOBS, handle.job_id, 1, worker="w:1")
        run = journal.load(conn, JOBS, handle.job_id)
        assert run is not None
        assert journal.requeue(
            conn, JOBS, run, error="later", transition=Transition.RETRY, actor="w:1"
        )
    # The operator looked while attempt 1 was queued; attempt 2 is queued now.
    with pytest.raises(operator.Conflict) as moved:
        operator.cancel(db, "jobs", handle.job_id, actor="ann", reason="stop", attempts=0)
    assert moved.value.code == "moved"
    assert run_row(db, handle.job_id)["state"] == "queued"
    done = operator.cancel(db, "jobs", handle.job_id, actor="ann", reason="stop", attempts=1)
    assert (done.attempts, run_row(db, handle.job_id)["outcome"]) == (1, "cancelled")


def test_a_heartbeat_that_cannot_reach_the_database_gives_up_at_the_stale_limit() -> None:
    unreachable = make_engine("postgresql+psycopg2://jobsapp@127.0.0.1:9/nowhere")
    with Heartbeat(
        unreachable, JOBS, uuid.uuid4(), 1, interval=0.1, stale_after=3.0, token=uuid.uuid4()
    ) as beat:
        time.sleep(0.5)
        beat.check()  # a failed stamp or two is not a lost lease
        eventually(lambda: beat.lost, timeout=10)
        with pytest.raises(LeaseLost, match="no heartbeat reached the database"):
            beat.check()


def test_a_heartbeat_past_the_stale_limit_says_so_whoever_notices_first() -> None:
    # The ticker's beat may mark the lease lost before the body's own check runs: the
    # body must still hear that the database was out of reach, not a generic loss.
    unreachable = make_engine("postgresql+psycopg2://jobsapp@127.0.0.1:9/nowhere")
    beat = Heartbeat(
        unreachable, JOBS, uuid.uuid4(), 1, interval=0.1, stale_after=0.2, token=uuid.uuid4()
    )
    time.sleep(0.3)
    assert beat.beat() is False
    with pytest.raises(LeaseLost, match=r"no heartbeat reached the database for 0\.2s"):
        beat.check()


def test_a_job_that_always_snoozes_fails_at_the_snooze_limit(worker: object, db: Engine) -> None:
    handle = tasks.snoozer.delay("zz")
    when_due = relay.RelayConfig(grace=timedelta(0))

    def failed() -> bool:
        relay.run_once(app, db, when_due)
        return handle.journal_state == "failed"

    eventually(failed, timeout=40, interval=0.5)
    row = run_row(db, handle.job_id)
    assert (row["outcome"], row["attempts"], tasks.calls("zz")) == ("snooze_limit", 3, 3)
    assert transitions(db, handle.job_id).count("snooze") == 2


def test_the_embedded_database_waits_for_the_disk_on_every_commit(sqlite_url: str) -> None:
    # WAL with synchronous=NORMAL may lose the last commits on power loss: an upload
    # already answered 202 could vanish. FULL (2) syncs the WAL at each commit.
    with make_engine(sqlite_url).connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2
