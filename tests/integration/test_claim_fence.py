"""The claim fence: every write of a running attempt names its claim's token.

A PostgreSQL crash may lose a claim committed without waiting for the flush; the relay's
republish is then claimed again with the same attempt number. Here the first claim is
rolled back instead (what the crash does to it), on both dialects, and each write the first
worker would still make is refused although job_id, state and attempt all match.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from jobsapp.attachments import reprocess
from jobsapp.attachments import tasks as attachment_tasks
from jobsapp.attachments.models import ATTACHMENT_RUNS, REPROCESS, REPROCESS_RUNS, RUNS
from jobsapp.attachments.service import accept_upload
from jobsapp.db import autocommit, relaxed_autocommit
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal.registry import JOBS, RunTable
from jobsapp.lifecycle.rules.errors import LeaseLost
from jobsapp.lifecycle.rules.states import Outcome, Transition
from jobsapp.lifecycle.worker.context import RunContext
from jobsapp.lifecycle.worker.heartbeat import Heartbeat
from jobsapp.storage import ObjectStore
from tests.support import tasks
from tests.support.attachments import attachment_row, configured_store
from tests.support.journal_view import events, run_row
from tests.support.migrations import sqlite_then_postgres
from tests.support.waiting import eventually
from tests.unit import images

W1, W2 = "w1@host:1", "w2@host:2"


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with configured_store(f"file://{tmp_path}") as local:
        yield local


def lost_then_claimed_again(
    db: Engine, spec: RunTable, job_id: uuid.UUID
) -> tuple[journal.Run, journal.Run]:
    """W1's claim of attempt 1 as W1 holds it, gone from the journal; then W2's claim of
    the same attempt, on the worker's own path (prepared, relaxed commit, on PostgreSQL)."""
    with db.connect() as conn:
        tx = conn.begin()
        lost = journal.claim(conn, spec, job_id, 1, worker=W1)
        tx.rollback()
    with relaxed_autocommit(db) as conn:
        again = journal.claim(conn, spec, job_id, 1, worker=W2)
    assert lost is not None
    assert again is not None
    assert lost.attempts == again.attempts == 1
    assert lost.claim_token != again.claim_token
    return lost, again


def context(db: Engine, spec: RunTable, row: journal.Run, worker: str) -> RunContext:
    beat = Heartbeat(db, spec, row.job_id, 1, 60.0, 3600.0, token=row.claimed_token)
    return RunContext(engine=db, spec=spec, row=row, worker=worker, heartbeat=beat)


def test_every_write_of_a_lost_claim_is_refused_though_its_attempt_matches(db: Engine) -> None:
    job_id = tasks.echo.apply_async((f"fence-{uuid.uuid4()}",)).job_id
    lost, again = lost_then_claimed_again(db, JOBS, job_id)
    stale = lost.claimed_token
    with relaxed_autocommit(db) as conn:
        assert not journal.heartbeat(conn, JOBS, job_id, 1, token=stale)
    with autocommit(db) as conn:
        assert not journal.succeed(conn, JOBS, job_id, 1, token=stale, actor=W1)
        assert not journal.fail(
            conn, JOBS, job_id, 1, token=stale, outcome=Outcome.PERMANENT, error="x", actor=W1
        )
        assert (
            journal.requeue(conn, JOBS, lost, error="later", transition=Transition.RETRY, actor=W1)
            is None
        )
    row = run_row(db, job_id)
    assert (row["state"], row["worker"]) == ("running", W2)
    assert row["claim_token"] == again.claimed_token
    # The claim that holds the run is honoured, and its finish is the one recorded.
    with relaxed_autocommit(db) as conn:
        assert journal.heartbeat(conn, JOBS, job_id, 1, token=again.claimed_token)
    with autocommit(db) as conn:
        assert journal.succeed(conn, JOBS, job_id, 1, token=again.claimed_token, actor=W2)
    finished = [(e["transition"], e["actor"]) for e in events(db, job_id)]
    assert finished == [("enqueue", "producer"), ("claim", W2), ("succeed", W2)]


def test_the_lost_claims_body_is_told_at_its_next_beat(db: Engine) -> None:
    job_id = tasks.echo.apply_async((f"fence-{uuid.uuid4()}",)).job_id
    lost, _ = lost_then_claimed_again(db, JOBS, job_id)
    ctx = context(db, JOBS, lost, W1)
    ctx.heartbeat.interval = 0.05
    with ctx.heartbeat as beat:
        eventually(lambda: beat.lost, timeout=10)
        with pytest.raises(LeaseLost, match="lost its lease"):
            ctx.check_lease()
    with pytest.raises(LeaseLost, match="finish refused"), ctx.completing():
        pytest.fail("the body's result transaction opened under a lost claim")
    assert run_row(db, job_id)["state"] == "running"


def test_attachment_writes_of_a_lost_claim_are_refused(db: Engine, store: ObjectStore) -> None:
    accepted = accept_upload(images.solid("PNG"), "a.png", None)
    with db.connect() as conn:
        job_id = conn.execute(
            select(RUNS.c.job_id).where(RUNS.c.attachment_id == accepted.attachment_id)
        ).scalar_one()
    lost, again = lost_then_claimed_again(db, ATTACHMENT_RUNS, job_id)
    zombie = attachment_tasks._Job(
        context(db, ATTACHMENT_RUNS, lost, W1), accepted.attachment_id, 1
    )
    attachment_tasks._mark_processing(zombie)
    assert attachment_row(db, accepted.attachment_id)["state"] == "queued"
    verdict = attachment_tasks._Verdict(True, "bad")
    with pytest.raises(LeaseLost, match="failure refused"):
        attachment_tasks._fail_together(zombie, ValueError("bad"), verdict)
    assert attachment_row(db, accepted.attachment_id)["state"] == "queued"
    holder = attachment_tasks._Job(
        context(db, ATTACHMENT_RUNS, again, W2), accepted.attachment_id, 1
    )
    attachment_tasks._mark_processing(holder)
    assert attachment_row(db, accepted.attachment_id)["state"] == "processing"


def test_a_backfill_step_of_a_lost_claim_is_refused(db: Engine) -> None:
    job_id = reprocess.start_backfill(1).job_id
    lost, again = lost_then_claimed_again(db, REPROCESS_RUNS, job_id)
    step = reprocess.Steps(enqueued=1)
    cursor = uuid.uuid4()
    with db.begin() as conn, pytest.raises(LeaseLost, match="no longer running"):
        reprocess._advance(conn, context(db, REPROCESS_RUNS, lost, W1), cursor, step)
    with db.begin() as conn:
        reprocess._advance(conn, context(db, REPROCESS_RUNS, again, W2), cursor, step)
    with db.connect() as conn:
        moved = conn.execute(
            select(REPROCESS.c.cursor, REPROCESS.c.enqueued).where(REPROCESS.c.job_id == job_id)
        ).one()
    assert tuple(moved) == (cursor, 1)


def test_migration_0009_goes_down_and_up_again_on_both_dialects(tmp_path: Path) -> None:
    sqlite_then_postgres(tmp_path, "fence", "claim_token", below="0008")
