"""Reconcile after an S3 outage: real Postgres, Redis broker, SeaweedFS and a worker.

The outage is the worker's S3 endpoint pointed at a closed port while the uploads are
processed with one attempt each; the reconcile pass runs once the store is back.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from sqlalchemy import Engine, func, select, update

from jobsapp.attachments.models import ATTACHMENT_RUNS, ATTACHMENTS, RUNS, VARIANTS
from jobsapp.attachments.service import accept_upload
from jobsapp.attachments.tasks import process_attachment
from jobsapp.celery_app import app
from jobsapp.db import utcnow
from jobsapp.lifecycle.journal import EVENTS
from jobsapp.maintenance import reconcile
from jobsapp.storage import ObjectStore
from tests.conftest import use_database
from tests.support.attachments import DEAD_S3_ENDPOINT, environment, sha256
from tests.support.waiting import eventually
from tests.unit import images

OUTAGE_VICTIMS = 50
CORRUPT = 3


@pytest.fixture
def db(request: pytest.FixtureRequest) -> Engine:
    return use_database(request.getfixturevalue("postgres_url"))


@contextmanager
def running_worker() -> Iterator[None]:
    app.loader.import_default_modules()
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False):
        yield


def states(engine: Engine, ids: list[uuid.UUID]) -> dict[str, int]:
    stmt = (
        select(ATTACHMENTS.c.state, ATTACHMENTS.c.error_code, func.count())
        .where(ATTACHMENTS.c.id.in_(ids))
        .group_by(ATTACHMENTS.c.state, ATTACHMENTS.c.error_code)
    )
    with engine.connect() as conn:
        return {f"{s}:{c}" if c else s: n for s, c, n in conn.execute(stmt).all()}


def all_reach(engine: Engine, ids: list[uuid.UUID], state: str, timeout: float) -> None:
    try:
        eventually(lambda: states(engine, ids).get(state) == len(ids), timeout=timeout)
    except AssertionError:
        raise AssertionError(f"not all {state}: {states(engine, ids)}") from None


def accept_corrupt(store: ObjectStore, engine: Engine) -> uuid.UUID:
    """An upload whose staged bytes fail to decode in the pipeline (validation passed
    the original; what is staged afterwards is a truncated JPEG)."""
    accepted = accept_upload(images.solid("PNG"), "c.png", None)
    bad = images.truncated_jpeg()
    this = ATTACHMENTS.c.id == accepted.attachment_id
    with engine.begin() as conn:
        key = conn.execute(select(ATTACHMENTS.c.staging_key).where(this)).scalar_one()
        conn.execute(update(ATTACHMENTS).where(this).values(
            sha256=sha256(bad), size=len(bad), content_type="image/jpeg"))  # fmt: skip
    store.delete(key)
    store.put_if_absent(key, bad, sha256(bad), "image/jpeg")
    return accepted.attachment_id


def reconcile_events(engine: Engine) -> list[dict[str, Any]]:
    stmt = select(EVENTS).where(EVENTS.c.actor.like("operator:reconcile%"))
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(stmt).mappings()]


def job_ids(engine: Engine, ids: list[uuid.UUID]) -> set[uuid.UUID]:
    with engine.connect() as conn:
        rows = conn.execute(select(RUNS.c.job_id).where(RUNS.c.attachment_id.in_(ids)))
        return set(rows.scalars())


def after_cool_down() -> reconcile.Request:
    policy = ATTACHMENT_RUNS.reconcile
    assert policy is not None
    return reconcile.Request(now=utcnow() + policy.cool_down + timedelta(seconds=1))


def test_one_pass_after_an_s3_outage_brings_every_victim_to_ready(
    s3: ObjectStore, db: Engine, redis_clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process_attachment, "max_attempts", 1)
    corrupt = [accept_corrupt(s3, db) for _ in range(CORRUPT)]
    with running_worker():
        all_reach(db, corrupt, "failed:corrupt_image", timeout=60)
    victims = [accept_upload(images.solid("PNG"), f"{i}.png", None).attachment_id
               for i in range(OUTAGE_VICTIMS)]  # fmt: skip
    with environment(JOBSAPP_S3_ENDPOINT_URL=DEAD_S3_ENDPOINT), running_worker():
        all_reach(db, victims, "failed:storage_unavailable", timeout=120)

    # Within the cool-down nothing is taken again: the outage may not be over.
    assert reconcile.run_once(db, app, ATTACHMENT_RUNS, reconcile.Request()).retaken == []
    with running_worker():
        first = reconcile.run_once(db, app, ATTACHMENT_RUNS, after_cool_down())
        all_reach(db, victims, "ready", timeout=120)
        second = reconcile.run_once(db, app, ATTACHMENT_RUNS, after_cool_down())

    assert {job for job, _ in first.retaken} == job_ids(db, victims)
    assert {code for _, code in first.retaken} == {"storage_unavailable"}
    assert (second.retaken, second.refused) == ([], {})
    audit = reconcile_events(db)
    assert sorted(e["job_id"] for e in audit) == sorted(job_ids(db, victims))
    assert {(e["transition"], e["actor"], e["attempt"]) for e in audit} == {
        ("replay", "operator:reconcile", 2)
    }
    assert all(f"reconcile pass {first.pass_id}" in e["reason"] for e in audit)
    assert states(db, corrupt) == {"failed:corrupt_image": CORRUPT}
    with db.connect() as conn:
        runs = conn.execute(select(RUNS.c.state, RUNS.c.attempts, func.count())
                            .where(RUNS.c.attachment_id.in_(victims))
                            .group_by(RUNS.c.state, RUNS.c.attempts)).all()  # fmt: skip
    # One run per attachment, its second attempt: a re-take is never a second job.
    assert runs == [("succeeded", 2, OUTAGE_VICTIMS)]
    with db.connect() as conn:
        published = VARIANTS.c.attachment_id.in_(victims)
        variants = conn.execute(select(func.count()).where(published)).scalar_one()
    assert variants == 3 * OUTAGE_VICTIMS
