"""Reconcile after an S3 outage: real Postgres, Redis broker, SeaweedFS and a worker.

The outage is the worker's S3 endpoint pointed at a closed port while the uploads are
processed with one attempt each; the reconcile pass runs once the store is back.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Engine, func, select, update

from jobsapp import cli, operator
from jobsapp.attachments.models import ATTACHMENT_RUNS, ATTACHMENTS, RUNS, VARIANTS
from jobsapp.attachments.service import accept_upload
from jobsapp.attachments.tasks import process_attachment
from jobsapp.celery_app import app
from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import EVENTS
from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.lifecycle.rules.states import Outcome
from jobsapp.maintenance import reconcile
from jobsapp.storage import ObjectStore
from jobsapp.web.app import create_app
from tests.support import tasks
from tests.support.attachments import DEAD_S3_ENDPOINT, environment, sha256
from tests.support.databases import use_database
from tests.support.journal_view import events, held_by, run_row
from tests.support.planted import (
    failed_generic_job,
    failed_job,
    queued_attachment_job,
)
from tests.support.waiting import eventually
from tests.support.workers import in_process_worker
from tests.unit import images

OUTAGE_VICTIMS = 50
CORRUPT = 3


@pytest.fixture
def db(request: pytest.FixtureRequest) -> Engine:
    return use_database(request.getfixturevalue("postgres_url"))


@contextmanager
def running_worker() -> Iterator[None]:
    with in_process_worker(concurrency=4):
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
        conn.execute(
            update(ATTACHMENTS)
            .where(this)
            .values(sha256=sha256(bad), size=len(bad), content_type="image/jpeg")
        )
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


def passes_after_cool_down(engine: Engine) -> list[reconcile.Report]:
    """Passes until one is not cut short by its time budget (8 s): on a loaded machine 50
    retakes can take longer, and a pass then leaves the rest to the next, as beat's would."""
    passes = [reconcile.run_once(engine, app, ATTACHMENT_RUNS, after_cool_down())]
    while passes[-1].cut_short:
        assert passes[-1].retaken, "a pass cut short before it took anything"
        passes.append(reconcile.run_once(engine, app, ATTACHMENT_RUNS, after_cool_down()))
    return passes


def test_one_pass_after_an_s3_outage_brings_every_victim_to_ready(
    s3: ObjectStore, db: Engine, redis_clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process_attachment, "max_attempts", 1)
    corrupt = [accept_corrupt(s3, db) for _ in range(CORRUPT)]
    with running_worker():
        all_reach(db, corrupt, "failed:corrupt_image", timeout=60)
    victims = [
        accept_upload(images.solid("PNG"), f"{i}.png", None).attachment_id
        for i in range(OUTAGE_VICTIMS)
    ]
    with environment(JOBSAPP_S3_ENDPOINT_URL=DEAD_S3_ENDPOINT), running_worker():
        all_reach(db, victims, "failed:storage_unavailable", timeout=120)

    # Within the cool-down nothing is taken again: the outage may not be over.
    assert reconcile.run_once(db, app, ATTACHMENT_RUNS, reconcile.Request()).retaken == []
    with running_worker():
        passes = passes_after_cool_down(db)
        all_reach(db, victims, "ready", timeout=120)
        second = reconcile.run_once(db, app, ATTACHMENT_RUNS, after_cool_down())

    retaken = [taken for one in passes for taken in one.retaken]
    assert sorted(job for job, _ in retaken) == sorted(job_ids(db, victims))
    assert {code for _, code in retaken} == {"storage_unavailable"}
    assert (second.retaken, second.refused) == ([], {})
    audit = reconcile_events(db)
    assert sorted(e["job_id"] for e in audit) == sorted(job_ids(db, victims))
    assert {(e["transition"], e["actor"], e["attempt"]) for e in audit} == {
        ("replay", "operator:reconcile", 2)
    }
    pass_of = {job: one.pass_id for one in passes for job, _ in one.retaken}
    assert all(f"reconcile pass {pass_of[e['job_id']]}" in e["reason"] for e in audit)
    assert states(db, corrupt) == {"failed:corrupt_image": CORRUPT}
    with db.connect() as conn:
        runs = conn.execute(
            select(RUNS.c.state, RUNS.c.attempts, func.count())
            .where(RUNS.c.attachment_id.in_(victims))
            .group_by(RUNS.c.state, RUNS.c.attempts)
        ).all()
    # One run per attachment, its second attempt: a re-take is never a second job.
    assert runs == [("succeeded", 2, OUTAGE_VICTIMS)]
    with db.connect() as conn:
        published = VARIANTS.c.attachment_id.in_(victims)
        variants = conn.execute(select(func.count()).where(published)).scalar_one()
    assert variants == 3 * OUTAGE_VICTIMS


# ------------------------------------------------------------- by hand: CLI and API


def test_old_failures_the_policy_never_retakes_do_not_starve_a_transient_one(db: Engine) -> None:
    policy = JOBS.reconcile
    assert policy is not None
    # Older than the transient failure, so first in a batch ordered by finish, and each
    # containing the retaken code "TransientError" inside a longer word.
    for i in range(policy.batch + 5):
        failed_generic_job(db, "NonTransientError: bad input", hours=3 + i / 1000)
    outage = failed_generic_job(db, "TransientError: upstream down", hours=2)

    report = reconcile.run_once(db, Celery("memory", broker="memory://"), JOBS, reconcile.Request())

    assert report.retaken == [(outage, "TransientError")]
    assert run_row(db, outage)["state"] == "queued"


def test_an_operator_reconciles_by_hand_from_the_cli(
    db: Engine, redis_clean: None, capsys: pytest.CaptureFixture[str]
) -> None:
    outage = failed_generic_job(db, "TransientError: upstream down")
    other = failed_generic_job(db, "KeyError: 'x'")

    assert cli.main(["reconcile", "--module", "jobs", "--dry-run"]) == 0
    (dry,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert dry["retaken"] == [{"job_id": str(outage), "error_code": "TransientError"}]
    assert run_row(db, outage)["state"] == "failed"

    assert (
        cli.main(["reconcile", "--module", "jobs", "--error-code", "KeyError", "--actor", "alice"])
        == 0
    )
    (done,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert done["retaken"] == [{"job_id": str(other), "error_code": "KeyError"}]
    assert run_row(db, other)["state"] == "queued"
    replayed = [e for e in events(db, other) if e["transition"] == "replay"]
    assert [e["actor"] for e in replayed] == ["operator:reconcile:alice"]
    assert run_row(db, outage)["state"] == "failed"


def reconciled_and_failed_again(
    engine: Engine, job_id: uuid.UUID, error: str, *, hours: float = 0.0
) -> None:
    """An earlier reconcile pass replayed the job; its next attempt failed ``hours`` ago."""
    operator.replay(
        engine,
        "jobs",
        job_id,
        actor=reconcile.ACTOR,
        reason="an earlier pass",
        app=Celery("memory", broker="memory://"),
    )
    at = utcnow() - timedelta(hours=hours)
    with engine.begin() as conn:
        attempt = int(run_row(engine, job_id)["attempts"]) + 1
        assert journal.claim(conn, JOBS, job_id, attempt, worker="w@h:1", now=at)
        assert journal.fail(
            conn,
            JOBS,
            job_id,
            attempt,
            token=held_by(conn, JOBS, job_id),
            outcome=Outcome.EXHAUSTED,
            error=error,
            actor="w@h:1",
            now=at,
        )


def failed_attachment_run(engine: Engine, error: str) -> uuid.UUID:
    return failed_job(engine, ATTACHMENT_RUNS, queued_attachment_job(engine), error=error)


def test_a_dry_run_names_the_rule_that_holds_back_each_failed_run(
    db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = JOBS.reconcile  # TransientError, 30 minutes' cool-down, one round
    assert policy is not None
    outage = "TransientError: upstream down"
    # Older outage victims than the batch holds: the newest one waits for the next pass.
    batch = [failed_generic_job(db, outage, hours=5 + i / 1000) for i in range(policy.batch)]
    next_pass = failed_generic_job(db, outage, hours=4)
    recent = failed_generic_job(db, outage, hours=5 / 60)
    not_retryable = failed_generic_job(db, "KeyError: 'x'")
    capped = failed_generic_job(db, outage, hours=3)
    reconciled_and_failed_again(db, capped, outage)
    cancelled = tasks.echo.new_job(("m",), {}, uuid.uuid4())
    with db.begin() as conn:
        journal.enqueue(conn, cancelled, now=utcnow(), actor="test")
    operator.cancel(db, "jobs", cancelled.job_id, actor="test", reason="a duplicate")
    corrupt = failed_attachment_run(db, "[corrupt_image] AttachmentFailed: cannot decode")

    assert cli.main(["reconcile", "--dry-run"]) == 0

    passes = {p["module"]: p for p in map(json.loads, capsys.readouterr().out.splitlines())}
    jobs, attachments = passes["jobs"], passes["attachments"]
    assert {r["job_id"] for r in jobs["retaken"]} == {str(j) for j in batch}
    held = {h["job_id"]: (h["rule"], h["why"]) for h in jobs["held_back"]}
    until = (run_row(db, recent)["finished_at"] + policy.cool_down).astimezone(UTC)
    assert held == {
        str(next_pass): ("batch_full", "batch full: a later pass takes it"),
        str(recent): ("cool_down", f"cool-down until {until.isoformat(timespec='seconds')}"),
        str(not_retryable): (
            "not_retryable",
            "error code not retryable: the error carries none of TransientError",
        ),
        str(capped): ("rounds_cap", "rounds cap reached: 1 of 1 reconcile rounds spent"),
        str(cancelled.job_id): (
            "not_a_failure",
            "outcome cancelled: reconcile retakes only exhausted, permanent or stale runs",
        ),
    }
    assert attachments["retaken"] == []
    never = "error code corrupt_image is never retaken"
    assert attachments["held_back"] == [
        {"job_id": str(corrupt), "rule": "never_retaken", "why": never}
    ]
    assert (jobs["held_back_more"], attachments["held_back_more"]) == (False, False)
    # A dry run: nothing moved.
    assert {run_row(db, j)["state"] for j in (*batch, next_pass, recent, capped)} == {"failed"}


def test_the_query_selects_exactly_the_runs_the_decision_retakes(db: Engine) -> None:
    """The SQL of ``candidates`` and the Python of ``decide`` state the same rules twice:
    over every combination of outcome, error, age and rounds they agree."""
    policy = JOBS.reconcile
    assert policy is not None
    errors = ["TransientError: upstream down", "NonTransientError: bad", "KeyError: 'x'"]
    for error, hours, rounds in itertools.product(errors, (0.1, 0.4, 2.0), (0, 1)):
        job_id = failed_generic_job(db, error, hours=hours + rounds)
        if rounds:
            reconciled_and_failed_again(db, job_id, error, hours=hours)
    for error in errors:  # a cancel's reason is its last_error: an outcome, not a failure
        job, at = tasks.echo.new_job(("m",), {}, uuid.uuid4()), utcnow() - timedelta(hours=2)
        with db.begin() as conn:
            journal.enqueue(conn, job, now=at, actor="test")
            assert journal.cancel(
                conn, JOBS, job.job_id, attempts=0, actor="test", reason=error, now=at
            )
    now = utcnow()

    chosen = reconcile.candidates(db, JOBS, policy, policy.retake, now)
    every = reconcile.left_alone(db, JOBS, [], limit=1000)
    decided = {
        r["job_id"]: reconcile.decide(reconcile.failure_of(r), policy, policy.retake, now)
        for r in every
    }

    assert len(every) == 3 * 3 * 2 + 3
    assert {r["job_id"] for r in chosen} == {
        j for j, d in decided.items() if isinstance(d, reconcile.Retake)
    }
    assert len(chosen) == 1  # TransientError, 2 hours ago, no round yet
    assert {d.rule for d in decided.values() if isinstance(d, reconcile.HeldBack)} == {
        reconcile.Rule.NOT_A_FAILURE,
        reconcile.Rule.NOT_RETRYABLE,
        reconcile.Rule.ROUNDS_CAP,
        reconcile.Rule.COOL_DOWN,
    }


def test_the_admin_api_runs_a_pass_and_refuses_a_never_code(db: Engine) -> None:
    outage = failed_generic_job(db, "TransientError: upstream down")
    token = "reconcile-token-7f3a9c2e5b1d8064"
    with environment(JOBSAPP_ADMIN_TOKEN=token):
        client = create_app().test_client()
        auth = {"Authorization": f"Bearer {token}"}
        dry = client.post("/v1/admin/reconcile", headers=auth, json={"dry_run": True})
        corrupt = {"module": "attachments", "error_code": "corrupt_image"}
        never = client.post("/v1/admin/reconcile", headers=auth, json=corrupt)
        anonymous = client.post("/v1/admin/reconcile", json={})
    assert dry.status_code == 200
    by_module = {p["module"]: p for p in dry.get_json()["passes"]}
    assert set(by_module) >= {"jobs", "attachments", "reprocess"}
    assert by_module["jobs"]["retaken"] == [{"job_id": str(outage), "error_code": "TransientError"}]
    assert (never.status_code, never.get_json()["error"]) == (409, "never_retaken")
    assert anonymous.status_code == 401
    assert run_row(db, outage)["state"] == "failed"
