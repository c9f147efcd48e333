"""Pipeline versions and re-processing: real Postgres, Redis broker, SeaweedFS S3 and a worker.

Two versions of one attachment racing are ordered with row locks held by the test, not
with sleeps: the run that must finish last is stopped at its fenced finish (its run row
is locked) while the other one publishes, so both orders are exercised every time.
"""

from __future__ import annotations

import argparse
import hashlib
import uuid
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, func, select

from jobsapp.attachments import commands
from jobsapp.attachments.models import ATTACHMENTS, RUNS, VARIANTS
from jobsapp.attachments.pipeline import UnknownPipeline
from jobsapp.attachments.reprocess import Progress, reprocess_to
from jobsapp.attachments.service import accept_upload
from jobsapp.attachments.tasks import process_attachment
from jobsapp.lifecycle.journal import EnqueueOutcome
from jobsapp.storage import ObjectStore
from tests.support.attachments import attachment_row, run_rows, variant_rows
from tests.support.databases import use_database
from tests.support.journal_view import events
from tests.support.planted import all_on, plant_ready, published_versions
from tests.support.waiting import eventually
from tests.unit import images

VARIANT_NAMES = {"thumbnail", "crop", "optimized"}


@pytest.fixture
def db(request: pytest.FixtureRequest) -> Engine:
    return use_database(request.getfixturevalue("postgres_url"))


# --------------------------------------------------------------------------- helpers


def job_of(attachment_id: uuid.UUID, version: int) -> uuid.UUID:
    return process_attachment.derive_job_id(
        (), {"attachment_id": attachment_id, "pipeline_version": version}
    )


def run_state(engine: Engine, job_id: uuid.UUID) -> str | None:
    with engine.connect() as conn:
        return conn.execute(select(RUNS.c.state).where(RUNS.c.job_id == job_id)).scalar()


def enqueue_events(engine: Engine, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, int]:
    """Enqueues in each job's history (its run row carries one, event rows any others)."""
    counts = {j: [e["transition"] for e in events(engine, j)].count("enqueue") for j in job_ids}
    return {job_id: n for job_id, n in counts.items() if n}


def lock(conn: Connection, table: Any, column: Any, value: uuid.UUID) -> None:
    conn.execute(select(table.c[column]).where(table.c[column] == value).with_for_update())


# ------------------------------------------------------------------ pure bookkeeping


def test_progress_counts_each_enqueue_outcome() -> None:
    start = Progress(version=2, total=5, failed_before=1)
    after = start.counted(
        [
            EnqueueOutcome.ENQUEUED,
            EnqueueOutcome.DUPLICATE,
            EnqueueOutcome.ENQUEUED,
            EnqueueOutcome.SKIPPED,
        ]
    )
    assert (after.enqueued, after.in_flight, after.busy, after.seen) == (2, 1, 1, 4)
    assert (after.total, after.failed_before) == (5, 1)


# ------------------------------------------------------------------------ the race


@pytest.mark.parametrize("last", [1, 2], ids=["v1-finishes-last", "v2-finishes-last"])
def test_racing_versions_end_on_the_newest_whichever_finishes_last(
    s3: ObjectStore, db: Engine, redis_clean: None, request: pytest.FixtureRequest, last: int
) -> None:
    first = 3 - last
    accepted = accept_upload(images.large_jpeg(), "big.jpg", None)
    attachment_id = accepted.attachment_id
    jobs = {v: job_of(attachment_id, v) for v in (1, 2)}
    process_attachment.apply_async(kwargs={"attachment_id": attachment_id, "pipeline_version": 2})

    with db.connect() as gate, db.connect() as finish:
        # Both runs are claimed, then wait at their first write of the attachment, so
        # both are in flight before either renders.
        gate_tx = gate.begin()
        lock(gate, ATTACHMENTS, "id", attachment_id)
        request.getfixturevalue("worker")
        eventually(lambda: {run_state(db, j) for j in jobs.values()} == {"running"})
        # The run that must finish last is held at its fenced finish (its run row).
        finish_tx = finish.begin()
        lock(finish, RUNS, "job_id", jobs[last])
        gate_tx.commit()
        eventually(lambda: run_state(db, jobs[first]) == "succeeded", timeout=60)
        row = attachment_row(db, attachment_id)
        assert (row["state"], row["published_version"]) == ("ready", first)
        assert run_state(db, jobs[last]) == "running"
        finish_tx.commit()
    eventually(lambda: run_state(db, jobs[last]) == "succeeded", timeout=60)

    row = attachment_row(db, attachment_id)
    assert (row["state"], row["published_version"]) == ("ready", 2)
    runs = run_rows(db, attachment_id)
    assert [(r["state"], r["attempts"]) for r in runs] == [("succeeded", 1)] * 2
    # Each version published its own variants once; the newest is what clients see.
    rows = variant_rows(db, attachment_id)
    assert sorted((v["pipeline_version"], v["variant"]) for v in rows) == sorted(
        (version, name) for version in (1, 2) for name in VARIANT_NAMES
    )
    # Staging went with the last run to finish, not before.
    eventually(lambda: s3.head(row["staging_key"]) is None)


# ---------------------------------------------------------------- reprocess_to()


def test_reprocess_enqueues_in_batches_and_running_it_again_enqueues_nothing_twice(
    s3: ObjectStore, db: Engine, redis_clean: None, request: pytest.FixtureRequest
) -> None:
    ids = plant_ready(db, s3, 23)
    seen: list[Progress] = []
    done = reprocess_to(db, 2, batch=5, progress=seen.append)
    assert [(p.seen, p.total) for p in seen] == [(5, 23), (10, 23), (15, 23), (20, 23), (23, 23)]
    assert (done.enqueued, done.in_flight, done.busy) == (23, 0, 0)
    # No worker yet: every job is still queued, so a second run finds each one.
    again = reprocess_to(db, 2, batch=5)
    assert (again.total, again.enqueued, again.in_flight) == (23, 0, 23)
    assert all_on(db, ids, 1)

    request.getfixturevalue("worker")
    eventually(lambda: all_on(db, ids, 2), timeout=60)
    jobs = [job_of(i, 2) for i in ids]
    assert {run_state(db, j) for j in jobs} == {"succeeded"}
    assert enqueue_events(db, jobs) == dict.fromkeys(jobs, 1)
    with db.connect() as conn:
        attempts = conn.execute(select(RUNS.c.attempts).where(RUNS.c.job_id.in_(jobs))).scalars()
        assert set(attempts) == {1}
        v2_rows = conn.execute(
            select(func.count()).select_from(VARIANTS).where(VARIANTS.c.pipeline_version == 2)
        ).scalar_one()
    assert v2_rows == 3 * len(ids)
    # Everything is on version 2 now: nothing is left to do.
    assert reprocess_to(db, 2).total == 0


def test_a_failed_job_at_the_version_is_left_out_unless_asked_for(
    s3: ObjectStore, db: Engine, worker: object
) -> None:
    broken, *fine = plant_ready(db, s3, 3)
    # Its original no longer matches the upload: its version-2 job fails for good.
    key = attachment_row(db, broken)["original_key"]
    forged = images.solid("PNG", (8, 8))
    s3.delete(key)
    s3.put_if_absent(key, forged, hashlib.sha256(forged).hexdigest(), "image/png")
    failed = process_attachment.apply_async(
        kwargs={"attachment_id": broken, "pipeline_version": 2}
    ).settled()
    assert (failed["state"], failed["attempts"]) == ("failed", 1)

    done = reprocess_to(db, 2)
    assert (done.total, done.enqueued, done.failed_before) == (2, 2, 1)
    eventually(lambda: all_on(db, fine, 2), timeout=30)
    # Still served on version 1, and not run again behind the operator's back.
    assert published_versions(db, [broken])[broken] == ("ready", 1)
    assert run_state(db, job_of(broken, 2)) == "failed"

    retried = reprocess_to(db, 2, retry_failed=True)
    assert (retried.total, retried.enqueued, retried.failed_before) == (1, 1, 0)
    rerun = eventually(
        lambda: run_state(db, job_of(broken, 2)) == "failed" and run_rows(db, broken)[-1]
    )
    assert rerun["attempts"] == 2


def test_an_unknown_version_or_batch_is_refused(db: Engine) -> None:
    with pytest.raises(UnknownPipeline):
        reprocess_to(db, 99)
    with pytest.raises(ValueError, match="batch"):
        reprocess_to(db, 2, batch=0)


def test_the_commands_plug_into_any_argparse_subparsers() -> None:
    # What jobsapp.cli does with them: ``commands.register(sub)``.
    parser = argparse.ArgumentParser(prog="jobsapp")
    commands.register(parser.add_subparsers(dest="command", required=True))
    again = parser.parse_args(["reprocess", "--to-version", "2"])
    assert (again.handler, again.to_version, again.batch, again.pause, again.retry_failed) == (
        commands.reprocess,
        2,
        100,
        0.0,
        False,
    )
    check = parser.parse_args(["verify", "--repair", "--wait", "5"])
    assert (check.handler, check.repair, check.deep, check.wait) == (
        commands.verify,
        True,
        False,
        5.0,
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["reprocess", "--to-version", "2", "--batch", "0"])


def test_reprocess_command_prints_progress_and_a_summary(
    s3: ObjectStore, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    plant_ready(db, s3, 3)
    assert commands.main(["reprocess", "--to-version", "2", "--batch", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "enqueued 2/3 (new 2, already queued 0, busy 0)",
        "enqueued 3/3 (new 3, already queued 0, busy 0)",
        "done: 3 attachments to v2: 3 enqueued, 0 already queued, 0 busy (another job holds"
        " the key). Each stays ready on its version until v2 is published.",
    ]
    assert commands.main(["reprocess", "--to-version", "9"]) == 2
    assert "no image pipeline version 9" in capsys.readouterr().err
