"""``jobsapp verify [--repair]``: real Postgres, Redis broker, SeaweedFS S3 and a worker.

Attachments are uploaded and published through the service and the worker; the test then
damages the store as an incident would (a lost object, other bytes under a key, objects
no row names) and runs the command, as an operator would, in this process.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, cast

import pytest
from celery.contrib.testing.worker import TestWorkController
from PIL import Image
from sqlalchemy import Engine, delete

from jobsapp import operator
from jobsapp.attachments import commands, pipeline, tasks
from jobsapp.attachments.models import VARIANTS
from jobsapp.attachments.service import accept_upload
from jobsapp.attachments.verify import (
    ORIGINAL,
    TOMBSTONE_PREFIX,
    Expected,
    Kind,
    Problem,
    Report,
    Rewrite,
    expected_of,
    judge,
    orphans_among,
    owner_of,
    plan_repair,
    repair,
    rewrites_of,
    tombstone_of,
    verify,
    wait_for,
)
from jobsapp.storage import ObjectInfo, ObjectStore
from tests.support.attachments import (
    DEAD_S3_ENDPOINT,
    attachment_row,
    environment,
    run_rows,
    settled,
    sha256,
    staging_dropped,
    variant_rows,
)
from tests.support.databases import use_database
from tests.unit import images

A, B = uuid.UUID(int=1), uuid.UUID(int=2)
WHEN = datetime(2026, 11, 30, tzinfo=UTC)


@pytest.fixture
def db(request: pytest.FixtureRequest) -> Engine:
    return use_database(request.getfixturevalue("postgres_url"))


def listed(key: str) -> ObjectInfo:
    return ObjectInfo(key=key, size=1, sha256=None, content_type=None, modified_at=WHEN)


# ------------------------------------------------------------------ decisions


def test_a_ready_attachment_needs_its_original_and_every_promised_variant() -> None:
    row = {"id": A, "published_version": 1, "original_key": "attachments/o", "sha256": "0" * 64}
    variants = [{"variant": "thumbnail", "object_key": "attachments/t", "sha256": "1" * 64}]
    expected, problems = expected_of(row, variants)
    assert [(e.name, e.key) for e in expected] == [
        (ORIGINAL, "attachments/o"),
        ("thumbnail", "attachments/t"),
    ]
    assert [(p.name, p.kind) for p in problems] == [
        ("crop", Kind.NO_ROW),
        ("optimized", Kind.NO_ROW),
    ]
    # A version this build does not know: what its rows name is what is checked.
    expected, problems = expected_of({**row, "published_version": 9}, variants)
    assert ([e.name for e in expected], problems) == ([ORIGINAL, "thumbnail"], [])


def test_judge_tells_missing_from_corrupt() -> None:
    item = Expected(A, 1, "crop", "attachments/c", "a" * 64)
    assert judge(item, "a" * 64) is None
    assert judge(item, None) == Problem(A, 1, "crop", Kind.MISSING, "attachments/c", "a" * 64)
    corrupt = judge(item, "b" * 64)
    assert corrupt is not None
    assert (corrupt.kind, corrupt.found, corrupt.recorded) == (Kind.CORRUPT, "b" * 64, "a" * 64)


def test_unnamed_objects_of_work_in_flight_are_not_orphans() -> None:
    named, busy, lone = (
        listed(f"attachments/{A}/v1/crop"),
        listed(f"attachments/{B}/v2/crop"),
        listed(f"attachments/{uuid.uuid4()}/v1/crop"),
    )
    stray = listed("attachments/readme.txt")
    orphans, in_flight = orphans_among([named, busy, lone, stray], {named.key}, {B})
    assert (orphans, in_flight) == ([lone, stray], 1)
    assert owner_of(busy.key) == B
    assert owner_of(stray.key) is None
    assert owner_of(f"staging/{A}") is None


def test_repair_reruns_what_the_original_can_rebuild_and_reports_the_rest() -> None:
    report = Report(
        problems=[
            Problem(A, 1, "thumbnail", Kind.MISSING, "k1"),
            Problem(A, 1, "crop", Kind.CORRUPT, "k2", "a" * 64, "b" * 64),
            Problem(B, 2, ORIGINAL, Kind.MISSING, "k3"),
            Problem(B, 2, "crop", Kind.MISSING, "k4"),
        ],
        orphans=[listed("attachments/x")],
    )
    plan = plan_repair(report)
    assert plan.reruns == {A: 1}
    assert [p.key for p in plan.corrupt] == ["k2"]
    assert [p.key for p in plan.unrepairable] == ["k3", "k4"]
    assert plan.orphans == report.orphans


def test_a_row_is_rewritten_only_where_the_store_recorded_other_bytes() -> None:
    def row(name: str, sha: str) -> dict[str, object]:
        return {
            "attachment_id": A,
            "pipeline_version": 1,
            "variant": name,
            "object_key": f"k/{name}",
            "sha256": sha,
        }

    def info(name: str, sha: str | None) -> ObjectInfo:
        return ObjectInfo(key=f"k/{name}", size=7, sha256=sha, content_type=None, modified_at=WHEN)

    rows = [
        row("same", "a" * 64),
        row("other", "a" * 64),
        row("gone", "a" * 64),
        row("unknown", "a" * 64),
    ]
    stored = {
        "k/same": info("same", "a" * 64),
        "k/other": info("other", "b" * 64),
        "k/gone": None,
        "k/unknown": info("unknown", None),
    }
    assert rewrites_of(rows, stored) == [Rewrite(A, 1, "other", "k/other", "a" * 64, "b" * 64, 7)]


# ------------------------------------------------------------------ the command


def _published(name: str, upload: bytes) -> uuid.UUID:
    attachment_id = accept_upload(upload, name, None).attachment_id
    settled(attachment_id, "ready")
    return attachment_id


def _variant(db: Engine, attachment_id: uuid.UUID, name: str) -> dict[str, object]:
    return next(v for v in variant_rows(db, attachment_id) if v["variant"] == name)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = commands.main(list(argv))
    return code, capsys.readouterr().out


def test_verify_finds_the_drift_and_repair_brings_the_attachments_back(
    s3: ObjectStore, worker: TestWorkController, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _published("a.png", images.solid("PNG"))
    b = _published("b.jpg", images.rotated_photo())
    for attachment_id in (a, b):
        staging_dropped(s3, db, attachment_id)
    assert run(capsys, "verify")[0] == 0
    before = {i: (attachment_row(db, i), variant_rows(db, i)) for i in (a, b)}

    lost, damaged = _variant(db, a, "thumbnail"), _variant(db, b, "crop")
    s3.delete(str(lost["object_key"]))
    forged = images.encode(Image.new("RGB", (9, 9)), "WEBP")
    s3.delete(str(damaged["object_key"]))
    s3.put_if_absent(str(damaged["object_key"]), forged, sha256(forged), "image/webp")
    orphans = [f"attachments/{uuid.uuid4()}/v1/thumbnail", f"attachments/{a}/v7/thumbnail"]
    for key in orphans:
        s3.put_if_absent(key, forged, sha256(forged), "image/webp")

    code, out = run(capsys, "verify")
    assert code == 1, out
    assert "2 ready attachments, 8 objects checked; 2 problems, 2 orphans" in out
    assert f"MISSING  {a} v1 thumbnail: {lost['object_key']}" in out
    assert f"CORRUPT  {b} v1 crop: {damaged['object_key']} (sha256 {sha256(forged)}" in out
    assert all(f"ORPHAN   {key} " in out for key in orphans)

    code, out = run(capsys, "verify", "--repair", "--wait", "60")
    assert code == 0, out
    assert "repair: deleted 2 orphans and 1 corrupt objects; requeued 2 attachments" in out
    assert "after repair: 2 ready attachments, 8 objects checked; 0 problems, 0 orphans" in out

    # The same rows as before, and the objects they name are back, byte for byte.
    for attachment_id in (a, b):
        assert (
            attachment_row(db, attachment_id)["published_version"],
            variant_rows(db, attachment_id),
        ) == (1, before[attachment_id][1])
        (job,) = run_rows(db, attachment_id)
        # Repaired through the lifecycle: the same job, one more attempt.
        assert (job["state"], job["attempts"]) == ("succeeded", 2)
    assert sha256(s3.get(str(lost["object_key"]))) == lost["sha256"]
    assert sha256(s3.get(str(damaged["object_key"]))) == damaged["sha256"]
    assert all(s3.head(key) is None for key in orphans)
    assert run(capsys, "verify")[0] == 0
    assert verify(db, s3, deep=True).clean


def test_a_lost_row_is_rebuilt_and_a_lost_original_is_reported_as_unrepairable(
    s3: ObjectStore, worker: TestWorkController, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    rowless = _published("r.png", images.solid("PNG"))
    sourceless = _published("s.png", images.solid("PNG", (20, 20)))
    crop = _variant(db, rowless, "crop")
    with db.begin() as conn:
        conn.execute(
            delete(VARIANTS).where(
                VARIANTS.c.attachment_id == rowless, VARIANTS.c.variant == "crop"
            )
        )
    s3.delete(str(attachment_row(db, sourceless)["original_key"]))

    report = verify(db, s3)
    assert sorted((p.attachment_id == rowless, p.name, p.kind) for p in report.problems) == [
        (False, ORIGINAL, Kind.MISSING),
        (True, "crop", Kind.NO_ROW),
    ]
    # The crop object is still there, named by no row.
    assert [o.key for o in report.orphans] == [crop["object_key"]]

    code, out = run(capsys, "verify", "--repair", "--wait", "60")
    assert code == 1, out
    assert f"UNREPAIRABLE MISSING  {sourceless} v1 original" in out
    assert "after repair: 2 ready attachments, 8 objects checked; 1 problems, 0 orphans" in out
    assert _variant(db, rowless, "crop")["sha256"] == crop["sha256"]
    # Nothing was run for the attachment whose source is gone.
    assert [r["attempts"] for r in run_rows(db, sourceless)] == [1]


def test_repair_converges_when_the_worker_encodes_other_bytes(
    s3: ObjectStore,
    worker: TestWorkController,
    db: Engine,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = _published("p.jpg", images.rotated_photo())
    staging_dropped(s3, db, a)
    lost = _variant(db, a, "thumbnail")
    s3.delete(str(lost["object_key"]))
    # The repair runs on a build whose encoder writes other bytes for the same picture.
    v1 = pipeline.PIPELINES[1]
    other = tuple(replace(spec, quality=spec.quality - 20) for spec in v1.variants)
    rebuilt = {**pipeline.PIPELINES, 1: replace(v1, variants=other)}
    monkeypatch.setattr(pipeline, "PIPELINES", MappingProxyType(rebuilt))

    code, out = run(capsys, "verify", "--repair", "--wait", "60")
    assert code == 0, out
    assert "repair: 1 variant rows now describe their re-rendered objects" in out
    assert "after repair: 1 ready attachments, 4 objects checked; 0 problems, 0 orphans" in out
    now = _variant(db, a, "thumbnail")
    assert now["sha256"] != lost["sha256"]
    assert (sha256(s3.get(str(now["object_key"]))), len(s3.get(str(now["object_key"])))) == (
        now["sha256"],
        now["size"],
    )
    assert run(capsys, "verify")[0] == 0
    assert verify(db, s3, deep=True).clean


class _PublishBeforeFirstDelete:
    """The store, where a publish lands after repair's reference check, before its delete."""

    def __init__(self, store: ObjectStore, publish: Callable[[], None]) -> None:
        self.store, self.publish, self.published = store, publish, False

    def delete(self, key: str) -> None:
        if not self.published:
            self.published = True
            self.publish()
        self.store.delete(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def _failed_after_writing_objects(db: Engine, monkeypatch: pytest.MonkeyPatch) -> uuid.UUID:
    """An attachment whose worker stored every object and then failed before its COMMIT."""

    def refuse(*_: object) -> None:
        raise tasks.AttachmentFailed("refused for the test", error_code="test_refused")

    with monkeypatch.context() as patched:
        patched.setattr(tasks, "_commit", refuse)
        attachment_id = accept_upload(images.rotated_photo(), "r.jpg", None).attachment_id
        settled(attachment_id, "failed")
    assert not variant_rows(db, attachment_id)
    return attachment_id


def test_an_orphan_adopted_by_a_publish_during_repair_is_not_deleted(
    s3: ObjectStore, worker: TestWorkController, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _failed_after_writing_objects(db, monkeypatch)
    report = verify(db, s3)
    assert len(report.orphans) == 4  # three variants and the original, no row names them
    (run_row,) = run_rows(db, a)

    def replay() -> None:
        # The operator's replay: attempt 2 finds the objects stored and commits rows naming them.
        operator.replay(db, "attachments", run_row["job_id"], actor="ops", reason="retry")
        settled(a, "ready")

    racing = cast(ObjectStore, _PublishBeforeFirstDelete(s3, replay))
    done = repair(db, racing, plan_repair(report))
    assert (done.orphans_deleted, done.orphans_restored) == (0, 4)

    assert attachment_row(db, a)["state"] == "ready"
    named = [str(v["object_key"]) for v in variant_rows(db, a)]
    named.append(str(attachment_row(db, a)["original_key"]))
    assert all(s3.head(key) is not None for key in named)
    assert verify(db, s3, deep=True).clean
    staging_dropped(s3, db, a)
    assert sorted(o.key for o in s3.list("")) == sorted(named)


def test_tombstones_left_by_a_dead_repair_are_settled_by_the_next(
    s3: ObjectStore, worker: TestWorkController, db: Engine
) -> None:
    a = _published("a.png", images.solid("PNG"))
    staging_dropped(s3, db, a)
    # A repair killed after moving two objects to their tombstones: one a row names (a
    # publish adopted it meanwhile), one nothing names.
    named = str(_variant(db, a, "crop")["object_key"])
    stray = f"attachments/{uuid.uuid4()}/v1/crop"
    s3.put_if_absent(stray, b"stray", sha256(b"stray"), "image/webp")
    for key in (named, stray):
        s3.copy(key, tombstone_of(key), str(s3.head(key).sha256))  # type: ignore[union-attr]
        s3.delete(key)
    assert not verify(db, s3).clean

    done = repair(db, s3, plan_repair(Report()))
    assert (done.orphans_deleted, done.orphans_restored) == (0, 1)
    assert verify(db, s3, deep=True).clean
    assert s3.head(stray) is None
    assert list(s3.list(f"{TOMBSTONE_PREFIX}/")) == []


def test_waiting_for_a_job_with_no_row_ends_at_once(db: Engine) -> None:
    job_id = uuid.uuid4()
    assert wait_for(db, [job_id], timeout=0) == {job_id: "gone"}


def test_an_unreachable_store_is_no_verdict(
    s3: ObjectStore, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    with environment(JOBSAPP_S3_ENDPOINT_URL=DEAD_S3_ENDPOINT):
        code = commands.main(["verify"])
    assert code == 2
    assert "object store unavailable" in capsys.readouterr().err
