"""The admin summary, the runs view and the operator's replay and cancel, on Postgres and
SQLite: what an operator sees and what their actions leave in the journal."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Connection, Engine, text, update

from jobsapp import cli, operator
from jobsapp.attachments.models import ATTACHMENT_RUNS
from jobsapp.celery_app import app
from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import OUTBOX, Run, registry
from jobsapp.lifecycle.transport import outbox, publisher
from jobsapp.maintenance import reaper, relay
from jobsapp.monitor import summary
from tests.support import tasks
from tests.support.attachments import attachment_row, environment
from tests.support.journal_view import events, outbox_rows, run_row
from tests.support.planted import (
    claimed,
    failed_job,
    queued_attachment_job,
    queued_job,
    rolled_up,
    succeeded_job,
)
from tests.support.servers import closed_port
from tests.support.waiting import eventually
from tests.support.web import TOKEN

JOBS = registry.JOBS
VIEW_COLUMNS = {
    "module",
    "job_id",
    "task_name",
    "concurrency_key",
    "state",
    "outcome",
    "attempts",
    "max_attempts",
    "heartbeat_at",
    "last_error",
    "next_retry_at",
    "created_at",
    "updated_at",
    "finished_at",
    "worker",
}


@pytest.fixture
def broker() -> Celery:
    """A real in-memory kombu broker: replayed messages stay with this test instead of
    landing in the Redis queue that other suites' workers consume."""
    return Celery("operator-tests", broker="memory://")


# --------------------------------------------------------------------------- factories


def by_id(rows: list[summary.SummaryRow]) -> dict[uuid.UUID, summary.SummaryRow]:
    return {row.job_id: row for row in rows}


# ----------------------------------------------------------------------------- summary


def test_the_summary_reads_every_registered_run_table(db: Engine) -> None:
    failed = failed_job(db)
    attachment_job = queued_attachment_job(db)

    rows = by_id(summary.summarize(db))

    assert {spec.module for spec in registry.all_tables()} == {"jobs", "attachments", "reprocess"}
    jobs_row, attachment_row_ = rows[failed], rows[attachment_job]
    assert (jobs_row.module, jobs_row.task_name, jobs_row.state) == (
        "jobs",
        "tests.doomed",
        "failed",
    )
    assert (jobs_row.outcome, jobs_row.attempts, jobs_row.max_attempts) == ("permanent", 1, 2)
    assert jobs_row.last_error == "ValueError: this never works"
    assert jobs_row.worker == "w1@host"
    assert 0 <= jobs_row.age_seconds < 60
    assert jobs_row.created_at <= jobs_row.updated_at
    assert (attachment_row_.module, attachment_row_.state) == ("attachments", "queued")
    assert (attachment_row_.attempts, attachment_row_.last_error) == (0, None)


def test_the_summary_filters_and_lists_newest_first(db: Engine) -> None:
    older = failed_job(db)
    newer = failed_job(db)
    queued_job(db)
    failed_job(db, ATTACHMENT_RUNS, queued_attachment_job(db))

    only_failed_jobs = summary.summarize(db, states=["failed"], module="jobs")
    newest = summary.summarize(db, states=["failed"], module="jobs", limit=1)

    assert [r.job_id for r in only_failed_jobs] == [newer, older]
    assert [r.job_id for r in newest] == [newer]
    both_tables = summary.summarize(db, states=["failed"])
    assert {r.module for r in both_tables} == {"jobs", "attachments"}
    assert [r.updated_at for r in both_tables] == sorted(
        (r.updated_at for r in both_tables), reverse=True
    )


@pytest.mark.parametrize(
    "filters",
    [{"states": ["done"]}, {"states": []}, {"module": "nope"}, {"limit": 0}, {"limit": 1001}],
)
def test_the_summary_refuses_filters_it_cannot_answer(filters: dict[str, Any]) -> None:
    with pytest.raises(summary.BadFilter):
        summary.summarize(None, **filters)  # type: ignore[arg-type]


def test_counts_have_every_module_and_state(db: Engine) -> None:
    failed_job(db)
    failed_job(db)
    queued_job(db)
    queued_attachment_job(db)
    rolled_up(db)

    counts = summary.counts(db)

    assert counts["jobs"] == {"queued": 1, "running": 0, "succeeded": 0, "failed": 2}
    assert counts["attachments"] == {"queued": 1, "running": 0, "succeeded": 0, "failed": 0}


def test_the_health_numbers_follow_the_journal(db: Engine) -> None:
    queued_job(db, ago=120)
    stale = queued_job(db)
    claimed(db, JOBS, stale, heartbeat_ago=90)
    claimed(db, JOBS, queued_job(db))

    ages = summary.oldest_queued_age(db)
    assert ages["jobs"] is not None
    assert 120 <= ages["jobs"] < 180
    assert ages["attachments"] is None
    assert summary.stale_running(db, timedelta(seconds=30)) == {
        "jobs": 1,
        "attachments": 0,
        "reprocess": 0,
    }
    # Three enqueues, none published (a Core transaction leaves that to the relay).
    assert summary.outbox_backlog(db) == 3
    assert 120 <= summary.outbox_lag(db) < 180
    health = summary.health(db, 30.0)
    assert (health.outbox_backlog, health.stale_running["jobs"]) == (3, 1)


def test_the_runs_view_projects_every_run_table(db: Engine) -> None:
    failed = failed_job(db)
    attachment_job = queued_attachment_job(db)

    with db.connect() as conn:
        result = conn.execute(text("SELECT * FROM job_runs_all ORDER BY module"))
        columns, rows = set(result.keys()), [dict(r) for r in result.mappings()]

    assert columns == VIEW_COLUMNS
    assert [(r["module"], uuid.UUID(str(r["job_id"]))) for r in rows] == [
        ("attachments", attachment_job),
        ("jobs", failed),
    ]
    assert [r["state"] for r in rows] == ["queued", "failed"]


# ------------------------------------------------------------------------------ replay


def test_replay_of_a_failed_job_is_a_new_attempt_with_an_audit_row(
    db: Engine, broker: Celery
) -> None:
    job_id = failed_job(db)

    done = operator.replay(db, "jobs", job_id, actor="alice", reason="upstream fixed", app=broker)

    assert (done.module, done.job_id, done.attempt, done.published) == ("jobs", job_id, 2, True)
    row = run_row(db, job_id)
    assert (row["state"], row["outcome"], row["attempts"], row["finished_at"]) == (
        "queued",
        None,
        1,
        None,
    )
    # One new attempt on top of the one spent, whatever the task declares (2 here).
    assert row["max_attempts"] == 2
    audit = events(db, job_id)[-1]
    assert (audit["transition"], audit["from_state"], audit["to_state"]) == (
        "replay",
        "failed",
        "queued",
    )
    assert (audit["actor"], audit["reason"], audit["attempt"]) == (
        "operator:alice",
        "upstream fixed",
        2,
    )
    outbox.MARKER.flush()  # the fast path marks its rows in bulk, a moment after publishing
    message = outbox_rows(db, job_id)[-1]
    assert (message["attempt"], message["published_at"] is not None) == (2, True)
    assert claimed(db, JOBS, job_id) == 2
    assert run_row(db, job_id)["attempts"] == 2


def test_replay_refuses_a_job_that_succeeded(db: Engine, broker: Celery) -> None:
    job_id = succeeded_job(db)
    history = events(db, job_id)

    with pytest.raises(operator.Conflict) as refused:
        operator.replay(db, "jobs", job_id, actor="alice", reason="again", app=broker)

    assert refused.value.code == "not_failed"
    assert "only a failed job can be replayed" in str(refused.value)
    assert "is succeeded" in str(refused.value)
    assert run_row(db, job_id)["state"] == "succeeded"
    assert events(db, job_id) == history


def test_replay_refuses_while_another_job_holds_the_key(db: Engine, broker: Celery) -> None:
    job_id = failed_job(db, job_id=queued_job(db, key="account:acme"))
    holder = queued_job(db, key="account:acme")

    with pytest.raises(operator.Conflict) as refused:
        operator.replay(db, "jobs", job_id, actor="alice", reason="again", app=broker)

    assert (refused.value.code, refused.value.holder) == ("key_busy", holder)
    assert str(holder) in str(refused.value)
    assert "account:acme" in str(refused.value)
    assert run_row(db, job_id)["state"] == "failed"
    assert "replay" not in [e["transition"] for e in events(db, job_id)]
    assert [m["attempt"] for m in outbox_rows(db, job_id)] == [1]


def test_unknown_jobs_and_modules_are_not_found(db: Engine, broker: Celery) -> None:
    for module, code in (("jobs", "unknown_job"), ("nope", "unknown_module")):
        with pytest.raises(operator.NotFound) as refused:
            operator.replay(db, module, uuid.uuid4(), actor="a", reason="r", app=broker)
        assert refused.value.code == code
        with pytest.raises(operator.NotFound):
            operator.cancel(db, module, uuid.uuid4(), actor="a", reason="r")


@pytest.mark.parametrize(
    ("actor", "reason"),
    [("alice", ""), ("alice", "   "), ("alice", "x" * 501), ("", "why"), ("a\nb", "why")],
)
def test_an_action_needs_a_reason_and_an_operator_name(actor: str, reason: str) -> None:
    with pytest.raises(operator.InvalidRequest):
        operator.cancel(None, "jobs", uuid.uuid4(), actor=actor, reason=reason)  # type: ignore[arg-type]


def test_a_failing_replay_hook_leaves_the_job_failed(db: Engine, broker: Celery) -> None:
    job_id = failed_job(db)

    def refuse(conn: Connection, run: Run, now: object) -> None:
        raise RuntimeError("the domain refuses")

    previous = operator.register_replay_hook("jobs", refuse)
    try:
        with pytest.raises(RuntimeError):
            operator.replay(db, "jobs", job_id, actor="alice", reason="again", app=broker)
    finally:
        operator.register_replay_hook("jobs", previous)

    assert run_row(db, job_id)["state"] == "failed"
    assert "replay" not in [e["transition"] for e in events(db, job_id)]
    assert [m["attempt"] for m in outbox_rows(db, job_id)] == [1]


def test_replaying_an_attachment_job_requeues_its_attachment(db: Engine, broker: Celery) -> None:
    job_id = failed_job(db, ATTACHMENT_RUNS, queued_attachment_job(db, "failed"))

    operator.replay(db, "attachments", job_id, actor="alice", reason="staging restored", app=broker)

    with db.connect() as conn:
        run = journal.load(conn, ATTACHMENT_RUNS, job_id)
    assert run is not None
    assert run.state == "queued"
    attachment = attachment_row(db, run.columns["attachment_id"])
    assert (attachment["state"], attachment["error_code"]) == ("queued", None)


# ------------------------------------------------------------------------------ cancel


def test_cancel_of_a_queued_job_fails_it_as_cancelled(db: Engine) -> None:
    job_id = queued_job(db, key="report:42")

    done = operator.cancel(db, "jobs", job_id, actor="bob", reason="duplicate request")

    assert (done.module, done.job_id, done.attempts) == ("jobs", job_id, 0)
    row = run_row(db, job_id)
    assert (row["state"], row["outcome"], row["last_error"]) == (
        "failed",
        "cancelled",
        "duplicate request",
    )
    audit = events(db, job_id)[-1]
    assert (audit["transition"], audit["from_state"], audit["to_state"]) == (
        "cancel",
        "queued",
        "failed",
    )
    assert (audit["actor"], audit["reason"]) == ("operator:bob", "duplicate request")
    # The key is free again: the same work can be enqueued.
    queued_job(db, key="report:42")


def test_cancel_of_a_running_job_asks_it_to_stop(db: Engine) -> None:
    job_id = queued_job(db)
    claimed(db, JOBS, job_id)

    done = operator.cancel(db, "jobs", job_id, actor="bob", reason="stop")

    assert (done.running, done.attempts) == (True, 1)
    row = run_row(db, job_id)
    assert (row["state"], row["cancel_requested_at"] is not None) == ("running", True)
    audit = events(db, job_id)[-1]
    assert (audit["transition"], audit["actor"], audit["reason"]) == (
        "cancel_request",
        "operator:bob",
        "stop",
    )


def test_a_cancelled_job_can_be_replayed(db: Engine, broker: Celery) -> None:
    job_id = queued_job(db)
    operator.cancel(db, "jobs", job_id, actor="bob", reason="paused for maintenance")

    done = operator.replay(db, "jobs", job_id, actor="bob", reason="maintenance over", app=broker)

    # Attempt 1 never started: the replay sends it again rather than skipping to 2.
    assert done.attempt == 1
    assert claimed(db, JOBS, job_id) == 1


def test_cancelling_an_attachment_job_fails_its_attachment(db: Engine) -> None:
    job_id = queued_attachment_job(db)

    operator.cancel(db, "attachments", job_id, actor="bob", reason="wrong file")

    with db.connect() as conn:
        run = journal.load(conn, ATTACHMENT_RUNS, job_id)
    assert run is not None
    attachment = attachment_row(db, run.columns["attachment_id"])
    assert (attachment["state"], attachment["error_code"]) == ("failed", "cancelled")


def test_a_revoked_attachment_job_the_reaper_ends_fails_its_attachment_cancelled(
    db: Engine,
) -> None:
    """Its worker froze before the revoke reached it; the reaper ends the run cancelled,
    and the client's attachment says cancelled too, not stale."""
    job_id = queued_attachment_job(db, "processing")
    with db.begin() as conn:
        assert journal.claim(conn, ATTACHMENT_RUNS, job_id, 1, worker="gone:1") is not None
    assert operator.cancel(db, "attachments", job_id, actor="bob", reason="wrong file").running
    cfg = reaper.ReaperConfig(stale_after=timedelta(milliseconds=1))

    def reaped() -> Run | None:
        reaper.run_once(db, cfg)
        with db.connect() as conn:
            run = journal.load(conn, ATTACHMENT_RUNS, job_id)
        return run if run is not None and run.state == "failed" else None

    run = eventually(reaped)
    assert run.outcome == "cancelled"
    attachment = attachment_row(db, run.columns["attachment_id"])
    assert (attachment["state"], attachment["error_code"]) == ("failed", "cancelled")


# ------------------------------------------------------------------------ with a worker


def test_a_replayed_job_runs_again_on_a_worker(worker: object, db: Engine) -> None:
    handle = tasks.fails_once.delay(f"fix-{uuid.uuid4()}")
    first = handle.settled()
    assert (first["state"], first["outcome"], first["attempts"]) == ("failed", "permanent", 1)

    done = operator.replay(db, "jobs", handle.job_id, actor="alice", reason="upstream fixed")

    assert done.published
    row = handle.settled()
    assert (row["state"], row["attempts"]) == ("succeeded", 2)
    assert [(e["transition"], e["attempt"]) for e in events(db, handle.job_id)] == [
        ("enqueue", 1),
        ("claim", 1),
        ("fail", 1),
        ("replay", 2),
        ("claim", 2),
        ("succeed", 2),
    ]


def test_a_cancelled_job_whose_message_was_dead_runs_after_a_replay(
    worker: object, db: Engine
) -> None:
    # Queued, its message published again and again and declared dead, then cancelled.
    token = f"dead-{uuid.uuid4()}"
    job = tasks.echo.new_job((token,), {}, None)
    with db.begin() as conn:
        journal.enqueue(conn, job, actor="producer")
        conn.execute(
            update(OUTBOX)
            .where(OUTBOX.c.job_id == job.job_id)
            .values(
                published_at=utcnow(),
                publish_count=outbox.MAX_UNCLAIMED_PUBLISHES,
                publish_failures=3,
                dead_at=utcnow(),
                last_error="never claimed",
            )
        )
    operator.cancel(db, "jobs", job.job_id, actor="bob", reason="paused")

    # The broker is down at the replay: "the relay will publish it".
    down = Celery("down", broker=f"redis://127.0.0.1:{closed_port()}/0", set_as_current=False)
    try:
        done = operator.replay(db, "jobs", job.job_id, actor="bob", reason="go", app=down)
    finally:
        publisher.broker_answered()
    assert not done.published
    (row,) = outbox_rows(db, job.job_id)
    assert (row["dead_at"], row["publish_failures"], row["last_error"]) == (None, 0, None)

    relay.run_once(app, db, relay.RelayConfig(grace=timedelta(0)))
    eventually(lambda: run_row(db, job.job_id)["state"] == "succeeded")
    assert tasks.calls(token) == 1


# --------------------------------------------------------------------------------- CLI


def test_a_cancelled_job_is_not_listed_among_the_failures(
    db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = failed_job(db)
    cancelled = queued_job(db)
    operator.cancel(db, "jobs", cancelled, actor="bob", reason="not needed")

    def listed(*states: str) -> set[uuid.UUID]:
        return {r.job_id for r in summary.summarize(db, states=states, module="jobs")}

    assert (listed("failed"), listed("cancelled")) == ({failed}, {cancelled})
    assert listed("failed", "cancelled", "expired") == {failed, cancelled}
    assert {failed, cancelled} <= {r.job_id for r in summary.summarize(db)}
    assert cli.main(["summary", "--state", "failed", "--json"]) == 0
    assert [row["job_id"] for row in json.loads(capsys.readouterr().out)] == [str(failed)]


def test_cli_summary_prints_a_table_and_json(
    db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = failed_job(db)

    assert cli.main(["summary", "--state", "failed", "--module", "jobs"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["MODULE", "TASK", "JOB_ID", "STATE", "ATTEMPTS", "AGE", "ERROR"]
    assert table[1].split()[:5] == ["jobs", "tests.doomed", str(job_id), "failed", "1/2"]
    assert table[1].endswith("ValueError: this never works")

    assert cli.main(["summary", "--json"]) == 0
    (shown,) = json.loads(capsys.readouterr().out)
    assert (shown["job_id"], shown["state"], shown["module"]) == (str(job_id), "failed", "jobs")


def test_the_cli_finds_the_job_by_its_id_and_a_replay_grants_one_attempt(
    db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = failed_job(db)

    assert cli.main(["replay", str(job_id), "--reason", "upstream fixed"]) == 0

    assert f"replayed jobs job {job_id}: attempt 2 queued" in capsys.readouterr().out
    row = run_row(db, job_id)
    assert (row["state"], row["attempts"], row["max_attempts"]) == ("queued", 1, 2)
    assert cli.main(["cancel", str(uuid.uuid4()), "--reason", "gone"]) == 1
    assert "no job " in capsys.readouterr().err


def test_cli_cancel_and_a_refused_replay(
    db: Engine, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("USER", "carol")
    job_id = queued_job(db)

    assert cli.main(["cancel", str(job_id), "--module", "jobs", "--reason", "not needed"]) == 0
    assert events(db, job_id)[-1]["actor"] == "operator:carol"
    assert cli.main(["cancel", str(job_id), "--module", "jobs", "--reason", "again"]) == 1
    assert "refused (not_active)" in capsys.readouterr().err

    done = succeeded_job(db)
    assert cli.main(["replay", str(done), "--module", "jobs", "--reason", "x"]) == 1
    assert "only a failed job can be replayed" in capsys.readouterr().err
    assert cli.main(["replay", str(done), "--module", "jobs", "--reason", " "]) == 2


def test_a_database_outage_is_a_503_on_the_operator_routes() -> None:
    from jobsapp.web.app import create_app

    # Nothing listens on port 9: every connection attempt is refused at once.
    dead = "postgresql+psycopg2://postgres@127.0.0.1:9/none"
    with environment(JOBSAPP_DATABASE_URL=dead, JOBSAPP_ADMIN_TOKEN=TOKEN):
        client = create_app().test_client()
        replies = [
            client.get("/metrics/cluster"),
            client.get("/v1/admin/jobs", headers={"Authorization": f"Bearer {TOKEN}"}),
            client.post(
                f"/v1/admin/jobs/jobs/{uuid.uuid4()}/cancel",
                json={"reason": "r"},
                headers={"Authorization": f"Bearer {TOKEN}"},
            ),
        ]

    for reply in replies:
        assert reply.status_code == 503
        assert reply.get_json()["error"] == "unavailable"
        assert "127.0.0.1" not in reply.get_json()["reason"]
        assert int(reply.headers["Retry-After"]) > 0


def test_the_process_metrics_answer_the_scrapers_token_while_the_database_is_down() -> None:
    """The scraper's token checks are throttled through the database (issue 34): while it
    is down they go unthrottled, so the process's own metrics still answer."""
    from jobsapp.web.app import create_app

    scraper = f"scraper-{uuid.uuid4().hex}"
    dead = "postgresql+psycopg2://postgres@127.0.0.1:9/none"
    with environment(JOBSAPP_DATABASE_URL=dead, JOBSAPP_METRICS_TOKEN=scraper):
        client = create_app().test_client()
        right = client.get("/metrics", headers={"Authorization": f"Bearer {scraper}"})
        wrong = client.get("/metrics", headers={"Authorization": f"Bearer not-{scraper}"})

    assert (right.status_code, wrong.status_code) == (200, 401)
