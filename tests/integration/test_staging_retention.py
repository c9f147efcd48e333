"""Staging retention: the pure decision, then the pass on planted cases in Postgres and S3.

Every case the policy names is planted as it would be found after a crash or a failure
(row state, run state, age) and the pass is run directly, as beat runs it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from jobsapp.attachments.store import staging_key
from jobsapp.maintenance import beat_tasks
from jobsapp.maintenance.staging import (
    Reason,
    StagedRow,
    StagingConfig,
    attachment_id_of,
    doomed,
    run_once,
    verdict,
)
from jobsapp.storage import ObjectInfo, ObjectStore
from tests.support.attachments import configured_store, environment
from tests.support.databases import use_database
from tests.support.env import service
from tests.support.planted import LONG_AGO, plant, stage

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
CFG = StagingConfig()


@pytest.fixture
def db(request: pytest.FixtureRequest) -> Engine:
    """Postgres, unless a test asks for SQLite by indirect parametrization."""
    dialect = getattr(request, "param", "postgres")
    return use_database(request.getfixturevalue(f"{dialect}_url"))


@pytest.fixture
def s3(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    """SeaweedFS under a prefix of this test's own, or the embedded local store."""
    if getattr(request, "param", "s3") == "local":
        url, endpoint = f"file://{tmp_path / 'objects'}", ""
    else:
        bucket = service("JOBSAPP_TEST_S3_BUCKET")
        url = f"s3://{bucket}/tests/{uuid.uuid4().hex}"
        endpoint = service("JOBSAPP_TEST_S3_ENDPOINT_URL")
    with configured_store(url, endpoint) as store:
        yield store


# ------------------------------------------------------------------ the decision


def staged(age: timedelta, key: str = "staging/x") -> ObjectInfo:
    return ObjectInfo(key=key, size=1, sha256=None, content_type=None, modified_at=NOW - age)


def row(
    state: str, *, age: timedelta = LONG_AGO, active: int = 0, intact: bool = True
) -> StagedRow:
    return StagedRow(state, NOW - age, active, intact)


@pytest.mark.parametrize(
    ("obj", "found", "expected"),
    [
        # No row: a crash after staging, or a refused insert; only once it is old.
        (staged(timedelta(hours=25)), None, Reason.ORPHAN),
        (staged(timedelta(hours=23)), None, None),
        # Current work is never touched, however old.
        (staged(LONG_AGO), row("queued"), None),
        (staged(LONG_AGO), row("processing", active=1), None),
        (staged(LONG_AGO), row("queued", active=0), None),
        # Failed: kept through the replay window, and while a replay is running.
        (staged(LONG_AGO), row("failed", age=timedelta(days=6)), None),
        (staged(LONG_AGO), row("failed", age=timedelta(days=8)), Reason.FAILED),
        (staged(LONG_AGO), row("failed", age=timedelta(days=8), active=1), None),
        # Ready: the post-publish delete a crash skipped, once no run needs the staging
        # and the published original really is there.
        (staged(timedelta(0)), row("ready", age=timedelta(0)), Reason.PUBLISHED),
        (staged(LONG_AGO), row("ready", active=1), None),
        (staged(LONG_AGO), row("ready", intact=False), None),
    ],
)
def test_what_staging_may_be_deleted(
    obj: ObjectInfo, found: StagedRow | None, expected: Reason | None
) -> None:
    assert verdict(obj, found, NOW, CFG) is expected


def test_doomed_pairs_each_object_with_its_row_by_key() -> None:
    keep, drop = staged(LONG_AGO, "staging/a"), staged(LONG_AGO, "staging/b")
    rows = {"staging/a": row("queued"), "staging/b": row("failed")}
    assert doomed([keep, drop], rows, NOW, CFG) == [(drop, Reason.FAILED)]


def test_only_keys_jobsapp_makes_name_an_attachment() -> None:
    attachment_id = uuid.uuid4()
    assert attachment_id_of(staging_key(attachment_id)) == attachment_id
    assert attachment_id_of("staging/not-a-uuid") is None


def test_the_windows_and_the_scan_limit_come_from_the_environment() -> None:
    with environment(
        JOBSAPP_STAGING_ORPHAN_HOURS="0.5",
        JOBSAPP_STAGING_FAILED_DAYS="2",
        JOBSAPP_STAGING_SCAN_LIMIT="300",
    ):
        cfg = beat_tasks.staging_config()
    assert (cfg.orphan_after, cfg.failed_after, cfg.scan_limit) == (
        timedelta(minutes=30),
        timedelta(days=2),
        300,
    )
    assert beat_tasks.staging_config() == StagingConfig()
    with environment(JOBSAPP_STAGING_ORPHAN_HOURS="0"), pytest.raises(ValueError, match="ORPHAN"):
        beat_tasks.staging_config()


# ------------------------------------------------------------------ the pass


def staging_keys(store: ObjectStore) -> set[str]:
    return {info.key for info in store.list("staging/")}


@pytest.mark.parametrize(
    ("db", "s3"),
    [("postgres", "s3"), ("sqlite", "local")],
    indirect=True,
    ids=["postgres-s3", "embedded-sqlite-local"],
)
def test_the_pass_deletes_what_the_policy_names_and_never_current_work(
    s3: ObjectStore, db: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    kept = {
        "young orphan": stage(s3),
        "queued": plant(db, s3, "queued", runs=((1, "queued"),)),
        "processing": plant(db, s3, "processing", runs=((1, "running"),)),
        "queued, its run not written yet": plant(db, s3, "queued"),
        "recently failed": plant(db, s3, "failed", age=timedelta(days=1), runs=((1, "failed"),)),
        "failed, being replayed": plant(db, s3, "failed", runs=((1, "queued"),)),
        "ready, reprocessing": plant(db, s3, "ready", runs=((1, "succeeded"), (2, "running"))),
        "ready, original lost": plant(db, s3, "ready", runs=((1, "succeeded"),), original=False),
    }
    deleted = {
        "old failed": plant(db, s3, "failed", age=timedelta(days=8), runs=((1, "failed"),)),
        "ready, delete skipped": plant(db, s3, "ready", age=timedelta(0), runs=((1, "succeeded"),)),
    }
    assert staging_keys(s3) == set(kept.values()) | set(deleted.values())

    caplog.set_level(logging.INFO, logger="jobsapp.maintenance.staging")
    report = run_once(db, s3, StagingConfig())
    assert staging_keys(s3) == set(kept.values())
    assert report.counts == {
        "examined": 10,
        "kept": 8,
        "errors": 0,
        "orphan": 0,
        "failed": 1,
        "published": 1,
    }
    (line,) = [r.getMessage() for r in caplog.records if "staging retention" in r.getMessage()]
    assert "'failed': 1" in line
    assert "'published': 1" in line

    # Once older than its window, the orphan goes too; current work still stays.
    time.sleep(1.2)
    report = run_once(db, s3, StagingConfig(orphan_after=timedelta(seconds=1)))
    assert report.counts["orphan"] == 1
    assert staging_keys(s3) == set(kept.values()) - {kept["young orphan"]}


def test_each_tick_examines_a_bounded_number_and_the_next_one_goes_on(
    s3: ObjectStore, db: Engine
) -> None:
    orphans = {stage(s3) for _ in range(7)}
    current = plant(db, s3, "queued", runs=((1, "queued"),))
    time.sleep(1.2)
    cfg = StagingConfig(orphan_after=timedelta(seconds=1), scan_limit=2, batch=1)
    shard, ticks = 0, 0
    while staging_keys(s3) != {current}:
        report = run_once(db, s3, cfg, start_shard=shard)
        assert report.counts["examined"] <= 2
        shard, ticks = report.next_shard, ticks + 1
        assert ticks < 40, "the pass never reached every orphan"
    assert ticks >= 4  # 7 orphans and a kept object, at most 2 a tick
    assert orphans.isdisjoint(staging_keys(s3))


def test_beat_task_reads_its_windows_from_the_environment(s3: ObjectStore, db: Engine) -> None:
    orphan = stage(s3)
    time.sleep(1.2)
    # 0.0002 h is 0.72 s.
    with environment(JOBSAPP_STAGING_ORPHAN_HOURS="0.0002"):
        counts = beat_tasks.PASSES["staging"]()
    assert counts["orphan"] == 1
    assert s3.head(orphan) is None
