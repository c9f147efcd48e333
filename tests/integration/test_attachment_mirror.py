"""Runs moved outside the task body (reaper, operator) move their attachment with them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from jobsapp.attachments.models import ATTACHMENT_RUNS, ATTACHMENTS, RUNS
from jobsapp.attachments.service import accept_upload
from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.rules.states import State, Transition
from jobsapp.maintenance import reaper
from jobsapp.storage import ObjectStore
from tests.support.attachments import attachment_row, configured_store
from tests.support.planted import running_attachment_run
from tests.unit import images


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ObjectStore]:
    with configured_store(f"file://{tmp_path}") as local:
        yield local


def test_a_reaped_run_puts_its_attachment_back_in_the_queue(db: Engine, store: ObjectStore) -> None:
    attachment_id, job_id = running_attachment_run(db, heartbeat_age=60)
    counts = reaper.run_once(db, reaper.ReaperConfig(stale_after=timedelta(seconds=10)))
    assert counts["attachments"] == 1
    assert attachment_row(db, attachment_id)["state"] == "queued"
    with db.connect() as conn:
        assert journal.load(conn, ATTACHMENT_RUNS, job_id).state == State.QUEUED  # type: ignore[union-attr]


def test_a_live_run_keeps_its_attachment_processing(db: Engine, store: ObjectStore) -> None:
    attachment_id, _ = running_attachment_run(db, heartbeat_age=1)
    reaper.run_once(db, reaper.ReaperConfig(stale_after=timedelta(seconds=10)))
    assert attachment_row(db, attachment_id)["state"] == "processing"


def test_cancel_and_replay_move_the_attachment(db: Engine, store: ObjectStore) -> None:
    accepted = accept_upload(images.solid("PNG"), "b.png", None)
    with db.begin() as conn:
        job_id = (
            conn.execute(RUNS.select().where(RUNS.c.attachment_id == accepted.attachment_id))
            .mappings()
            .one()["job_id"]
        )
        assert journal.cancel(
            conn,
            ATTACHMENT_RUNS,
            job_id,
            attempts=0,
            actor="operator:test",
            reason="wrong file",
            now=utcnow(),
        )
    row = attachment_row(db, accepted.attachment_id)
    assert (row["state"], row["error_code"]) == ("failed", "cancelled")
    with db.begin() as conn:
        message = journal.reopen(
            conn,
            ATTACHMENT_RUNS,
            job_id,
            from_state=State.FAILED,
            attempts=0,
            budget=3,
            transition=Transition.REPLAY,
            now=utcnow(),
            actor="operator:test",
            reason="retry",
        )
    assert message is not None
    row = attachment_row(db, accepted.attachment_id)
    assert (row["state"], row["error_code"]) == ("queued", None)


def test_cancelling_one_version_leaves_an_attachment_another_run_works_on(
    db: Engine, store: ObjectStore
) -> None:
    from jobsapp.attachments.tasks import process_attachment
    from jobsapp.celery_app import app
    from jobsapp.lifecycle.producer.enqueue import transaction

    attachment_id, _ = running_attachment_run(db, heartbeat_age=0)
    with transaction(app) as batch:
        v2 = process_attachment.enqueue_in(
            batch, kwargs={"attachment_id": attachment_id, "pipeline_version": 2}
        )
    with db.begin() as conn:
        assert journal.cancel(
            conn,
            ATTACHMENT_RUNS,
            v2.job_id,
            attempts=0,
            actor="operator:test",
            reason="not now",
            now=utcnow(),
        )
    assert attachment_row(db, attachment_id)["state"] == "processing"


def test_a_frozen_lock_holder_does_not_stall_the_reaper(pg: Engine, store: ObjectStore) -> None:
    attachment_id, job_id = running_attachment_run(pg, heartbeat_age=60)
    cfg = reaper.ReaperConfig(stale_after=timedelta(seconds=10))
    with pg.connect() as frozen:  # a worker paused between its write and its COMMIT
        frozen.execute(
            ATTACHMENTS.select().where(ATTACHMENTS.c.id == attachment_id).with_for_update()
        )
        started = time.monotonic()
        assert reaper.run_once(pg, cfg)["attachments"] == 0
        assert time.monotonic() - started < 10
        frozen.rollback()
    assert reaper.run_once(pg, cfg)["attachments"] == 1
    assert attachment_row(pg, attachment_id)["state"] == "queued"
    with pg.connect() as conn:
        assert journal.load(conn, ATTACHMENT_RUNS, job_id).state == State.QUEUED  # type: ignore[union-attr]
