"""Attachments end to end: real Postgres, Redis broker, SeaweedFS S3 and an in-process worker.

One pass runs on the embedded default (SQLite and the local object store) as well.
"""

from __future__ import annotations

import io
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from celery.contrib.testing.worker import TestWorkController
from celery.signals import task_failure, task_success
from PIL import Image
from sqlalchemy import Engine, delete

from bench import sample_images
from jobsapp.attachments.models import ATTACHMENTS, RUNS, VARIANTS
from jobsapp.attachments.pipeline import variant_key
from jobsapp.attachments.service import (
    ServiceUnavailable,
    accept_upload,
    get_attachment,
    open_variant,
)
from jobsapp.attachments.store import PUBLISHED_PREFIX
from jobsapp.attachments.tasks import TASK_NAME, process_attachment
from jobsapp.attachments.validation import RejectedUpload
from jobsapp.celery_app import app
from jobsapp.lifecycle import RetryPolicy
from jobsapp.storage import ObjectStore
from jobsapp.web.app import create_app
from tests.support.attachments import (
    DEAD_S3_ENDPOINT,
    attachment_row,
    broker_drained,
    configured_store,
    count,
    environment,
    run_rows,
    settled,
    sha256,
    staging_dropped,
    stored_objects,
    variant_rows,
)
from tests.support.databases import use_database
from tests.support.journal_view import events, outbox_rows, transitions
from tests.support.waiting import eventually
from tests.unit import images

V1_VARIANTS = ["thumbnail", "crop", "optimized"]


@pytest.fixture
def db(request: pytest.FixtureRequest) -> Engine:
    """Postgres, unless a test asks for SQLite by indirect parametrization."""
    dialect = getattr(request, "param", "postgres")
    return use_database(request.getfixturevalue(f"{dialect}_url"))


@pytest.fixture
def local_store(tmp_path: Path) -> Iterator[ObjectStore]:
    with configured_store(f"file://{tmp_path / 'objects'}") as store:
        yield store


class CeleryEnds:
    """How Celery ended each task, by name, as its ``task_success``/``task_failure``
    signals tell it in the worker (the in-process worker runs in this process)."""

    def __init__(self) -> None:
        self.failed: dict[str, BaseException] = {}
        self.succeeded: dict[str, object] = {}

    def _failure(self, sender: Any, exception: BaseException, **_: Any) -> None:
        self.failed[sender.name] = exception

    def _success(self, sender: Any, result: object, **_: Any) -> None:
        self.succeeded[sender.name] = result

    @contextmanager
    def listening(self) -> Iterator[None]:
        task_failure.connect(self._failure, weak=False)
        task_success.connect(self._success, weak=False)
        try:
            yield
        finally:
            task_failure.disconnect(self._failure)
            task_success.disconnect(self._success)


def _decoded(data: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(data))
    img.load()
    return img


def _assert_published(store: ObjectStore, view: dict[str, object], upload: bytes) -> None:
    """Every promised variant and the original are in the store, byte for byte as recorded."""
    assert view["state"] == "ready"
    assert view["published_version"] == 1
    variants = view["variants"]
    assert isinstance(variants, list)
    assert [v["name"] for v in variants] == V1_VARIANTS
    for variant in variants:
        data = store.get(variant["object_key"])
        assert (sha256(data), len(data)) == (variant["sha256"], variant["size"])
        img = _decoded(data)
        assert (img.format, img.size) == ("WEBP", (variant["width"], variant["height"]))
        assert len(img.getexif()) == 0
        assert not {"exif", "xmp", "icc_profile"} & set(img.info)
        for marker in (b"Exif", b"GPS", b"SN-123456", b"XMP"):
            assert marker not in data
    original = view["original"]
    assert isinstance(original, dict)
    assert original["sha256"] == sha256(upload) == view["sha256"]
    assert sha256(store.get(original["object_key"])) == original["sha256"]


def test_photos_are_published_with_every_variant(
    s3: ObjectStore, worker: TestWorkController, db: Engine
) -> None:
    uploads = {
        "photo.jpg": images.large_jpeg(),
        "alpha.png": images.png_with_alpha(),
        "rotated.jpg": images.rotated_photo(),
    }
    accepted = {name: accept_upload(data, name, None) for name, data in uploads.items()}
    assert all(a.created and a.state == "queued" for a in accepted.values())
    views = {name: settled(a.attachment_id, "ready") for name, a in accepted.items()}
    for name, view in views.items():
        _assert_published(s3, view, uploads[name])
        assert view["display_name"] == name
        (run,) = run_rows(db, accepted[name].attachment_id)
        assert (run["state"], run["attempts"], run["pipeline_version"]) == ("succeeded", 1, 1)
        # Staging goes once the result is published.
        staging_dropped(s3, db, accepted[name].attachment_id)
    assert list(s3.list("staging/")) == []

    big = {v["name"]: v for v in views["photo.jpg"]["variants"]}
    assert [(big[n]["width"], big[n]["height"]) for n in V1_VARIANTS] == [
        (256, 192),
        (512, 512),
        (4000, 3000),
    ]

    rotated = views["rotated.jpg"]
    assert (rotated["width"], rotated["height"]) == (400, 600)  # as displayed, not as stored
    thumb = next(v for v in rotated["variants"] if v["name"] == "thumbnail")
    img = _decoded(s3.get(thumb["object_key"])).convert("RGB")
    assert img.size == (171, 256)
    top, bottom = img.getpixel((85, 20)), img.getpixel((85, 235))
    assert isinstance(top, tuple)
    assert isinstance(bottom, tuple)
    assert top[0] > 200 > top[2]  # red on top: the EXIF orientation was applied
    assert bottom[2] > 200 > bottom[0]

    alpha = next(v for v in views["alpha.png"]["variants"] if v["name"] == "optimized")
    img = _decoded(s3.get(alpha["object_key"]))
    assert img.mode == "RGBA"
    left, right = img.getpixel((10, 50)), img.getpixel((190, 50))
    assert isinstance(left, tuple)
    assert isinstance(right, tuple)
    # Lossy WebP: near the source colour, not exact.
    assert left[0] > 245
    assert left[1] < 10
    assert left[3] == 255
    assert right[3] == 0

    # S3 serves a variant by a presigned URL; its bytes are the recorded ones.
    read = open_variant(accepted["rotated.jpg"].attachment_id, "thumbnail")
    assert read is not None
    assert read.url is not None
    assert read.stream is None
    with urllib.request.urlopen(read.url, timeout=10) as response:  # noqa: S310 - test S3
        assert sha256(response.read()) == thumb["sha256"] == read.sha256
    assert open_variant(accepted["rotated.jpg"].attachment_id, "original") is None


def test_one_idempotency_key_is_one_attachment(
    s3: ObjectStore, worker: TestWorkController, db: Engine
) -> None:
    data = images.solid("PNG")
    results = []
    barrier = threading.Barrier(6)

    def upload() -> None:
        barrier.wait()
        results.append(accept_upload(data, "same.png", "idem-1"))

    threads = [threading.Thread(target=upload) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.attachment_id for r in results}) == 1
    assert sorted(r.created for r in results) == [False] * 5 + [True]
    (attachment_id,) = {r.attachment_id for r in results}
    settled(attachment_id, "ready")
    staging_dropped(s3, db, attachment_id)

    again = accept_upload(data, "same.png", "idem-1")
    assert (again.attachment_id, again.state, again.created) == (attachment_id, "ready", False)
    with pytest.raises(RejectedUpload) as refused:
        accept_upload(images.solid("PNG", (10, 10)), "other.png", "idem-1")
    assert (refused.value.status, refused.value.code) == (422, "idempotency_key_reused")
    assert count(db, ATTACHMENTS) == 1
    assert len(run_rows(db, attachment_id)) == 1
    # The twins that lost the race deleted their own staging objects.
    assert list(s3.list("staging/")) == []


def _resend(db: Engine, job_id: uuid.UUID) -> None:
    """Deliver the job's first message again, twice, as a broker redelivery would."""
    (message,) = outbox_rows(db, job_id)
    body = {**message["body"], "outbox_id": message["id"]}
    app.send_task(TASK_NAME, kwargs=body)
    app.send_task(TASK_NAME, kwargs=body)


def test_duplicates_of_a_processing_message_do_no_work(
    s3: ObjectStore, worker: TestWorkController, db: Engine
) -> None:
    # A source slow enough to render (seconds) that the duplicate arrives mid-run.
    upload = sample_images.png((3464, 3464))
    accepted = accept_upload(upload, "big.png", None)
    eventually(lambda: attachment_row(db, accepted.attachment_id)["state"] == "processing")
    (run,) = run_rows(db, accepted.attachment_id)
    assert run["state"] == "running"
    _resend(db, run["job_id"])
    view = settled(accepted.attachment_id, "ready")
    broker_drained()
    _assert_published(s3, view, upload)
    assert transitions(db, run["job_id"]).count("claim") == 1
    assert len(variant_rows(db, accepted.attachment_id)) == 3
    assert len(run_rows(db, accepted.attachment_id)) == 1


def test_a_ready_job_delivered_again_changes_nothing(
    s3: ObjectStore, worker: TestWorkController, db: Engine
) -> None:
    accepted = accept_upload(images.rotated_photo(), "r.jpg", None)
    settled(accepted.attachment_id, "ready")
    staging_dropped(s3, db, accepted.attachment_id)
    (run,) = run_rows(db, accepted.attachment_id)
    before = (
        attachment_row(db, accepted.attachment_id),
        variant_rows(db, accepted.attachment_id),
        stored_objects(s3, ""),
    )

    _resend(db, run["job_id"])
    broker_drained()
    # Enqueued again after it finished: the same job's next attempt, which finds the
    # effect complete and publishes nothing.
    handle = process_attachment.apply_async(
        kwargs={"attachment_id": accepted.attachment_id, "pipeline_version": 1}
    )
    assert handle.job_id == run["job_id"]
    rerun = handle.settled()
    assert (rerun["state"], rerun["attempts"]) == ("succeeded", 2)

    after = (
        attachment_row(db, accepted.attachment_id),
        variant_rows(db, accepted.attachment_id),
        stored_objects(s3, ""),
    )
    assert after == before
    assert transitions(db, run["job_id"]).count("claim") == 2


def test_reprocessing_publishes_a_newer_version_never_an_older_one(
    s3: ObjectStore, worker: TestWorkController, db: Engine
) -> None:
    accepted = accept_upload(images.rotated_photo(), "r.jpg", None)
    attachment_id = accepted.attachment_id
    settled(attachment_id, "ready")
    # Version 2 from a foreign producer: ids as JSON strings, no journal row; the worker
    # claims it by inserting the run with the ids coerced.
    job_id = uuid.uuid4()
    app.send_task(
        TASK_NAME,
        kwargs={
            "schema_version": 1,
            "job_id": str(job_id),
            "module": "attachments",
            "attempt": 1,
            "enqueued_at": "2026-11-30T00:00:00+00:00",
            "attachment_id": str(attachment_id),
            "pipeline_version": 2,
        },
    )
    view = eventually(
        lambda: (v := get_attachment(attachment_id)) and v["published_version"] == 2 and v
    )
    assert view["state"] == "ready"
    assert [(v["name"], v["pipeline_version"]) for v in view["variants"]] == [
        (name, 2) for name in V1_VARIANTS
    ]
    thumb = next(v for v in view["variants"] if v["name"] == "thumbnail")
    assert (thumb["width"], thumb["height"]) == (341, 512)
    runs = {r["pipeline_version"]: r for r in run_rows(db, attachment_id)}
    assert runs[2]["job_id"] == job_id
    assert runs[2]["state"] == "succeeded"

    # Version 1 run again with one of its rows lost: it renders and inserts again (the
    # rows still there are kept by the effect key) but never takes the attachment back
    # from version 2.
    with db.begin() as conn:
        conn.execute(
            delete(VARIANTS).where(
                VARIANTS.c.attachment_id == attachment_id,
                VARIANTS.c.pipeline_version == 1,
                VARIANTS.c.variant == "crop",
            )
        )
    rerun = process_attachment.apply_async(
        kwargs={"attachment_id": attachment_id, "pipeline_version": 1}
    ).settled()
    assert (rerun["state"], rerun["attempts"]) == ("succeeded", 2)
    row = attachment_row(db, attachment_id)
    assert (row["state"], row["published_version"]) == ("ready", 2)
    assert len(variant_rows(db, attachment_id)) == 6


def test_a_failed_reprocess_keeps_the_attachment_ready(
    s3: ObjectStore, worker: TestWorkController, db: Engine
) -> None:
    accepted = accept_upload(images.solid("PNG"), "p.png", None)
    before = settled(accepted.attachment_id, "ready")
    original = before["original"]
    assert isinstance(original, dict)
    forged = images.solid("PNG", (8, 8))
    s3.delete(original["object_key"])
    s3.put_if_absent(original["object_key"], forged, sha256(forged), "image/png")
    run = process_attachment.apply_async(
        kwargs={"attachment_id": accepted.attachment_id, "pipeline_version": 2}
    ).settled()
    assert (run["state"], run["outcome"]) == ("failed", "permanent")
    assert "[original_checksum]" in run["last_error"]
    # Ready never goes back to processing or failed: version 1 is still served.
    assert get_attachment(accepted.attachment_id) == before


def test_replaced_staging_bytes_fail_with_staging_checksum(
    s3: ObjectStore, db: Engine, redis_clean: None, request: pytest.FixtureRequest
) -> None:
    accepted = accept_upload(images.solid("JPEG"), "x.jpg", None)
    staging = attachment_row(db, accepted.attachment_id)["staging_key"]
    forged = images.solid("JPEG", (32, 32))
    s3.delete(staging)
    s3.put_if_absent(staging, forged, sha256(forged), "image/jpeg")
    request.getfixturevalue("worker")

    view = settled(accepted.attachment_id, "failed")
    assert view["error_code"] == "staging_checksum"
    assert view["variants"] == []
    assert view["original"] is None
    (run,) = run_rows(db, accepted.attachment_id)
    assert (run["state"], run["outcome"], run["attempts"]) == ("failed", "permanent", 1)
    assert "[staging_checksum]" in run["last_error"]
    assert list(s3.list("attachments/")) == []
    # Kept for the operator; retention removes it after its window.
    assert s3.head(staging) is not None


def test_a_variant_already_stored_with_other_bytes_is_kept_not_overwritten(
    s3: ObjectStore, db: Engine, redis_clean: None, request: pytest.FixtureRequest
) -> None:
    # What a crashed attempt on a build with another encoder leaves behind.
    upload = images.solid("PNG")
    accepted = accept_upload(upload, "p.png", None)
    key = variant_key(PUBLISHED_PREFIX, accepted.attachment_id, 1, "thumbnail")
    earlier = images.encode(Image.new("RGB", (64, 48), images.RED), "WEBP", quality=10)
    s3.put_if_absent(key, earlier, sha256(earlier), "image/webp")
    request.getfixturevalue("worker")

    view = settled(accepted.attachment_id, "ready")
    thumb = next(v for v in view["variants"] if v["name"] == "thumbnail")
    assert (thumb["sha256"], thumb["size"]) == (sha256(earlier), len(earlier))
    assert s3.get(key) == earlier
    _assert_published(s3, view, upload)


def test_storage_down_on_the_worker_is_retried(
    s3: ObjectStore,
    db: Engine,
    redis_clean: None,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        process_attachment, "retry_policy", RetryPolicy(base_delay=1.0, max_delay=1.0, jitter=0)
    )
    accepted = accept_upload(images.solid("PNG"), "p.png", None)
    with environment(JOBSAPP_S3_ENDPOINT_URL=DEAD_S3_ENDPOINT):
        request.getfixturevalue("worker")
        job_id = eventually(lambda: run_rows(db, accepted.attachment_id)[0]["job_id"])
        retry = eventually(lambda: [e for e in events(db, job_id) if e["transition"] == "retry"])
        # Back to queued for the next attempt, not failed (docs/domains.md: processing -> queued).
        row = attachment_row(db, accepted.attachment_id)
        assert (row["state"], row["error_code"]) == ("queued", None)
    assert "storage_unavailable" in retry[0]["reason"]
    assert "StorageUnavailable" in retry[0]["reason"]
    view = settled(accepted.attachment_id, "ready")
    _assert_published(s3, view, images.solid("PNG"))
    (run,) = run_rows(db, accepted.attachment_id)
    assert run["state"] == "succeeded"
    assert run["attempts"] >= 2


def test_transient_failure_on_the_last_attempt_fails_the_attachment(
    s3: ObjectStore,
    db: Engine,
    redis_clean: None,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process_attachment, "max_attempts", 1)
    accepted = accept_upload(images.solid("PNG"), "p.png", None)
    with environment(JOBSAPP_S3_ENDPOINT_URL=DEAD_S3_ENDPOINT):
        request.getfixturevalue("worker")
        view = settled(accepted.attachment_id, "failed")
    assert view["error_code"] == "storage_unavailable"
    (run,) = run_rows(db, accepted.attachment_id)
    assert (run["state"], run["outcome"], run["attempts"]) == ("failed", "exhausted", 1)


def test_an_image_over_the_memory_budget_fails_with_memory_budget(
    s3: ObjectStore, db: Engine, redis_clean: None, request: pytest.FixtureRequest
) -> None:
    # 2000x2000 decodes to 16 MiB: more than the whole budget, so it is never decoded.
    accepted = accept_upload(images.encode(Image.new("RGB", (2000, 2000)), "PNG"), "p.png", None)
    ends = CeleryEnds()
    with environment(JOBSAPP_IMAGE_MEMORY_BUDGET_MB="4"), ends.listening():
        request.getfixturevalue("worker")
        view = settled(accepted.attachment_id, "failed")
        # What Celery says of the attempt (and so Flower, from the same task events): the
        # body's failure, not "succeeded ... finished by the body".
        failure = eventually(lambda: ends.failed.get(TASK_NAME))
    assert view["error_code"] == "memory_budget"
    assert type(failure).__name__ == "AttachmentFailed", failure
    assert "memory budget" in str(failure)
    assert TASK_NAME not in ends.succeeded
    (run,) = run_rows(db, accepted.attachment_id)
    assert (run["state"], run["outcome"], run["attempts"]) == ("failed", "permanent", 1)
    assert "memory budget" in run["last_error"]
    # The worker lived on: the next upload is processed.
    small = accept_upload(images.solid("PNG"), "s.png", None)
    _assert_published(s3, settled(small.attachment_id, "ready"), images.solid("PNG"))


def test_upload_with_storage_down_is_service_unavailable(s3: ObjectStore, db: Engine) -> None:
    with (
        environment(JOBSAPP_S3_ENDPOINT_URL=DEAD_S3_ENDPOINT),
        pytest.raises(ServiceUnavailable),
    ):
        accept_upload(images.solid("PNG"), "p.png", None)
    assert count(db, ATTACHMENTS) == 0
    assert count(db, RUNS) == 0


def test_upload_with_the_database_down_is_service_unavailable(s3: ObjectStore, db: Engine) -> None:
    with (
        environment(JOBSAPP_DATABASE_URL="postgresql+psycopg2://postgres@127.0.0.1:9/none"),
        pytest.raises(ServiceUnavailable),
    ):
        accept_upload(images.solid("PNG"), "p.png", None)
    assert count(db, ATTACHMENTS) == 0
    # The staged object has no row: retention's to delete, never a processed upload.
    assert len(list(s3.list("staging/"))) == 1


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_the_embedded_default_sqlite_and_local_store(
    local_store: ObjectStore, worker: TestWorkController, db: Engine
) -> None:
    uploads = {"rotated.jpg": images.rotated_photo(), "alpha.png": images.png_with_alpha()}
    accepted = {name: accept_upload(data, name, f"k-{name}") for name, data in uploads.items()}
    for name, a in accepted.items():
        view = settled(a.attachment_id, "ready")
        _assert_published(local_store, view, uploads[name])
        staging_dropped(local_store, db, a.attachment_id)
        # The local store has no URLs: the web streams the bytes.
        read = open_variant(a.attachment_id, "optimized")
        assert read is not None
        assert read.url is None
        assert read.stream is not None
        assert sha256(b"".join(read.stream)) == read.sha256
    assert list(local_store.list("staging/")) == []
    assert count(db, VARIANTS) == 6


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_published_variant_whose_object_is_gone_answers_404_not_retry_later(
    local_store: ObjectStore, worker: TestWorkController, db: Engine
) -> None:
    accepted = accept_upload(images.solid("PNG"), "p.png", None)
    view = settled(accepted.attachment_id, "ready")
    crop = next(v for v in view["variants"] if v["name"] == "crop")
    local_store.delete(crop["object_key"])  # a bucket policy, a hand that cleaned up
    token = "producers-7c1d-9a4e2b8f06d3c5e1-x"
    with environment(JOBSAPP_API_TOKEN=token):
        client = create_app().test_client()
        reply = client.get(
            f"/v1/attachments/{accepted.attachment_id}/variants/crop",
            headers={"Authorization": f"Bearer {token}"},
        )

    # It answered 503 with Retry-After: a client retried a loss forever.
    assert reply.status_code == 404, reply.get_data(as_text=True)
    assert "Retry-After" not in reply.headers
    assert "storage no longer has its object" in reply.get_json()["reason"]


def test_unknown_attachment_and_variant_are_none(s3: ObjectStore, db: Engine) -> None:
    assert get_attachment(uuid.uuid4()) is None
    assert open_variant(uuid.uuid4(), "thumbnail") is None
    accepted = accept_upload(images.solid("PNG"), "p.png", None)
    # Not published yet: nothing to open.
    assert open_variant(accepted.attachment_id, "thumbnail") is None
