"""A backfill pass that fails keeps its reason and statistics; reconcile resumes it.

Real Postgres, Redis and an in-process worker. The failure is the database refusing one
attachment's job mid-walk (a trigger raising, as a full disk or a constraint would): the
batches before it are committed, the one holding it is rolled back.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text

from jobsapp import operator
from jobsapp.attachments.models import REPROCESS, RUNS
from jobsapp.attachments.reprocess import Steps, backfill, start_backfill
from jobsapp.celery_app import app
from jobsapp.db import utcnow
from jobsapp.lifecycle import RetryPolicy
from jobsapp.lifecycle.journal import EnqueueOutcome
from jobsapp.maintenance import reconcile
from tests.support.databases import use_database
from tests.support.planted import plant_rows
from tests.support.waiting import eventually

COUNT = 50
BATCH = 10
POISONED = 24  # in id order: batches 1 and 2 commit, batch 3 fails


@pytest.fixture
def db(request: pytest.FixtureRequest) -> Engine:
    return use_database(request.getfixturevalue("postgres_url"))


@pytest.fixture
def refusing(db: Engine) -> Iterator[list[uuid.UUID]]:
    """Planted attachments; the database refuses a job for the ``POISONED``-th one."""
    ids = plant_rows(db, COUNT)
    with db.begin() as conn:
        conn.execute(
            text(f"""
            CREATE FUNCTION test_refuse_job() RETURNS trigger AS $$
            BEGIN
                IF NEW.attachment_id = '{ids[POISONED]}' THEN
                    RAISE EXCEPTION 'could not extend file: No space left on device';
                END IF;
                RETURN NEW;
            END $$ LANGUAGE plpgsql""")
        )
        conn.execute(
            text(
                "CREATE TRIGGER test_refuse_job BEFORE INSERT ON attachment_runs "
                "FOR EACH ROW EXECUTE FUNCTION test_refuse_job()"
            )
        )
    try:
        yield ids
    finally:
        drop_refusal(db)


def drop_refusal(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("DROP TRIGGER IF EXISTS test_refuse_job ON attachment_runs"))
        conn.execute(text("DROP FUNCTION IF EXISTS test_refuse_job()"))


def backfill_row(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(conn.execute(select(REPROCESS)).mappings().one())


def test_steps_add_up_and_say_where_they_stand() -> None:
    total = Steps(enqueued=3, skipped=1) + Steps(enqueued=2, failed=4)
    assert (total.scanned, total.enqueued, total.skipped, total.failed) == (10, 5, 1, 4)
    assert total.describe() == "scanned 10 (enqueued 5, skipped 1, failed 4)"


def test_a_failed_pass_keeps_its_record_and_reconcile_resumes_it(
    db: Engine, refusing: list[uuid.UUID], worker: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        backfill, "retry_policy", RetryPolicy(base_delay=0.2, max_delay=0.2, jitter=0)
    )
    started = start_backfill(2, batch=BATCH)
    assert started.outcome is EnqueueOutcome.ENQUEUED
    # One backfill per target version is active.
    assert start_backfill(2, batch=BATCH).holder == started.job_id

    failed = eventually(lambda: (row := backfill_row(db))["state"] == "failed" and row, timeout=60)
    assert (failed["outcome"], failed["attempts"]) == ("exhausted", failed["max_attempts"])
    assert (failed["cursor"], failed["scanned"], failed["enqueued"]) == (refusing[19], 20, 20)
    assert f"stopped at cursor {refusing[19]}, scanned 20 (enqueued 20" in failed["last_error"]
    assert "No space left on device" in failed["last_error"]

    drop_refusal(db)
    later = utcnow() + timedelta(hours=1)
    (report,) = reconcile.run_all(db, app, reconcile.Request(now=later), module="reprocess")
    assert report.retaken == [(started.job_id, "TransientError")]
    done = eventually(lambda: (row := backfill_row(db))["state"] == "succeeded" and row, timeout=60)
    steps = (done["scanned"], done["enqueued"], done["skipped"], done["failed"])
    assert steps == (COUNT, COUNT, 0, 0)
    with db.connect() as conn:
        jobs = conn.execute(select(func.count()).where(RUNS.c.pipeline_version == 2))
        assert jobs.scalar_one() == COUNT


def test_a_cancel_requested_while_a_pass_walks_stops_it_before_its_next_batch(
    db: Engine, worker: object
) -> None:
    """The batches' writes are fenced like the run's own: after a revoke's stop request no
    batch commits, though the heartbeat has not told the body yet."""
    plant_rows(db, 400)
    started = start_backfill(2, batch=BATCH, pause=0.02)
    eventually(lambda: backfill_row(db)["scanned"] >= BATCH, timeout=30)
    operator.cancel(db, "reprocess", started.job_id, actor="ops", reason="not now")
    # The request waited for a batch in flight (its row lock): what it sees is final.
    at_request = backfill_row(db)["enqueued"]
    done = eventually(lambda: (row := backfill_row(db))["state"] == "failed" and row, timeout=30)
    assert (done["outcome"], done["enqueued"], done["scanned"]) == (
        "cancelled",
        at_request,
        at_request,
    )
    with db.connect() as conn:
        jobs = conn.execute(select(func.count()).where(RUNS.c.pipeline_version == 2))
        assert jobs.scalar_one() == at_request
