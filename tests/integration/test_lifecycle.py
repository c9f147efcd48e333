"""The lifecycle contract, end to end through a real worker, on Postgres and on SQLite."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, text, update
from sqlalchemy.orm import Session

from jobsapp.celery_app import app
from jobsapp.lifecycle import EnqueueOutcome
from jobsapp.lifecycle.journal.tables import JobRun
from jobsapp.lifecycle.producer.enqueue import transaction
from jobsapp.maintenance import lease
from tests.support import tasks
from tests.support.journal_view import events, outbox_rows, run_count, run_row, transitions
from tests.support.waiting import eventually

SECRET = "s3cr3t-planted-value"


def test_same_job_id_twice_is_one_row(worker: object, db: Engine) -> None:
    job_id = uuid.uuid4()
    first = tasks.windowed.apply_async(("a",), job_id=job_id)
    second = tasks.windowed.apply_async(("a",), job_id=job_id)
    assert (first.outcome, second.outcome) == (EnqueueOutcome.ENQUEUED, EnqueueOutcome.DUPLICATE)
    first.settled()
    assert run_count(db) == 1
    assert tasks.calls("a") == 1


def test_after_the_dedup_window_the_same_job_runs_again(worker: object, db: Engine) -> None:
    job_id = uuid.uuid4()
    tasks.windowed.apply_async(("w",), job_id=job_id).settled()
    assert tasks.windowed.apply_async(("w",), job_id=job_id).outcome == "duplicate"
    time.sleep(1.2)
    again = tasks.windowed.apply_async(("w",), job_id=job_id)
    assert again.outcome == EnqueueOutcome.ENQUEUED
    row = again.settled()
    assert (row["state"], row["attempts"]) == ("succeeded", 2)
    assert tasks.calls("w") == 2
    assert run_count(db) == 1


def test_a_duplicate_answer_does_not_stretch_the_redis_key_past_the_journals_window(
    worker: object, db: Engine
) -> None:
    window = timedelta(seconds=tasks.SLOW_WINDOW)
    job_id = uuid.uuid4()
    key = f"jobsapp:dedup:jobs:{job_id}"
    # The body outlasts the window: its Redis key (counted from the enqueue) expires
    # while it runs, and the journal's window (counted from the finish) is still open.
    row = tasks.windowed_slow.apply_async(
        ("slow", tasks.SLOW_WINDOW + 0.5), job_id=job_id
    ).settled()
    assert tasks.counter().exists(key) == 0

    repeat = tasks.windowed_slow.apply_async(("slow", 0.0), job_id=job_id)
    assert repeat.outcome == EnqueueOutcome.DUPLICATE
    assert tasks.counter().exists(key) == 0  # the journal answered; nothing re-stored

    eventually(lambda: _database_now(db) > row["finished_at"] + window)
    again = tasks.windowed_slow.apply_async(("slow", 0.0), job_id=job_id)
    assert again.outcome == EnqueueOutcome.ENQUEUED
    assert (again.settled()["attempts"], tasks.calls("slow")) == (2, 2)


def _database_now(db: Engine) -> datetime:
    with db.connect() as conn:
        return lease.database_now(conn)


def test_one_active_job_per_key_under_a_thundering_herd(worker: object, db: Engine) -> None:
    handles = []
    barrier = threading.Barrier(20)

    def enqueue(i: int) -> None:
        barrier.wait()
        # The winner's body runs until the gate opens, so no enqueue can come after its end
        # however slowly the machine schedules the threads.
        handles.append(tasks.gated.apply_async(("herd", 60.0)))

    threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [h for h in handles if h.outcome == EnqueueOutcome.ENQUEUED]
    skipped = [h for h in handles if h.outcome == EnqueueOutcome.SKIPPED]
    assert len(winners) == 1
    assert len(skipped) == 19
    assert {h.holder for h in skipped} == {winners[0].job_id}
    tasks.open_gate("herd", 1)
    winners[0].settled()
    assert tasks.calls("herd") == 1
    after = tasks.gated.apply_async(("herd", 0.0))
    assert after.outcome == EnqueueOutcome.ENQUEUED
    after.settled()


def test_two_failures_then_success_is_one_row_with_three_attempts(
    worker: object, db: Engine
) -> None:
    handle = tasks.flaky.delay("f", 2, SECRET)
    row = handle.settled()
    assert (row["state"], row["attempts"]) == ("succeeded", 3)
    assert run_count(db) == 1
    history = events(db, handle.job_id)
    assert [e["transition"] for e in history].count("claim") == 3
    retries = [e for e in history if e["transition"] == "retry"]
    assert len(retries) == 2
    assert all("ConnectionError" in (e["reason"] or "") for e in retries)
    assert all(SECRET not in (e["reason"] or "") for e in history)
    assert [m["attempt"] for m in outbox_rows(db, handle.job_id)] == [1, 2, 3]
    assert SECRET not in (row["last_error"] or "")


def test_attempts_exhausted_ends_failed(worker: object, db: Engine) -> None:
    row = tasks.doomed.delay("d").settled()
    assert (row["state"], row["outcome"], row["attempts"]) == ("failed", "exhausted", 2)
    assert "ValueError: this never works" in row["last_error"]
    assert tasks.calls("d") == 2


def test_celery_autoretry_maps_to_attempts(worker: object, db: Engine) -> None:
    row = tasks.celery_retry.delay("c").settled()
    assert (row["state"], row["attempts"]) == ("succeeded", 3)
    assert tasks.celery_retry.max_attempts == 3


def test_heartbeat_stamps_while_the_body_runs(worker: object, db: Engine) -> None:
    handle = tasks.sleepy.delay("hb", 2.5)  # heartbeat every 0.5 s in the tests
    stamps = set()
    while (row := run_row(db, handle.job_id))["state"] in ("queued", "running"):
        if row["heartbeat_at"] is not None:
            stamps.add(row["heartbeat_at"])
        time.sleep(0.1)
    assert len(stamps) >= 3
    assert row["state"] == "succeeded"
    assert tasks.calls("hb:published") == 1


def test_the_redis_fast_path_mirrors_the_journal(worker: object, db: Engine) -> None:
    handle = tasks.windowed.delay("fast")
    handle.settled()
    key = f"jobsapp:dedup:jobs:{handle.job_id}"
    assert tasks.counter().ttl(key) > 0
    assert tasks.windowed.apply_async(("fast",), job_id=handle.job_id).outcome == "duplicate"
    assert run_count(db) == 1


def test_a_run_taken_by_the_reaper_publishes_nothing(worker: object, db: Engine) -> None:
    handle = tasks.sleepy.delay("zombie", 2.0)
    eventually(lambda: run_row(db, handle.job_id)["state"] == "running")
    runs = JobRun.__table__
    with db.begin() as conn:  # what the reaper does to a run it believes dead
        conn.execute(
            update(runs)
            .where(runs.c.job_id == handle.job_id)
            .values(state="queued", heartbeat_at=None)
        )
    time.sleep(3.0)
    assert tasks.calls("zombie") == 1
    assert tasks.calls("zombie:published") == 0
    row = run_row(db, handle.job_id)
    assert (row["state"], row["attempts"]) == ("queued", 1)
    assert "succeed" not in transitions(db, handle.job_id)


def test_short_retry_after_is_waited_inline(worker: object, db: Engine) -> None:
    row = tasks.paused.delay("p1", 1.0).settled()
    assert (row["state"], row["attempts"]) == ("succeeded", 1)
    assert tasks.calls("p1:done") == 1


def test_long_retry_after_frees_the_slot(worker: object, db: Engine) -> None:
    handle = tasks.paused.delay("p60", 60.0)
    row = eventually(
        lambda: (r := run_row(db, handle.job_id))["state"] == "queued" and r["next_retry_at"] and r
    )
    assert row["attempts"] == 1
    assert row["max_attempts"] == 4  # the pause did not spend an attempt
    tasks.echo.delay("next").settled(timeout=10)
    assert run_row(db, handle.job_id)["state"] == "queued"
    (pending,) = [m for m in outbox_rows(db, handle.job_id) if m["attempt"] == 2]
    assert pending["published_at"] is None


def test_duplicate_and_stale_messages_do_no_work(worker: object, db: Engine) -> None:
    handle = tasks.echo.delay("dup")
    handle.settled()
    (message,) = outbox_rows(db, handle.job_id)
    body = {**message["body"], "outbox_id": message["id"]}
    app.send_task("tests.echo", kwargs=body)
    app.send_task("tests.echo", kwargs=body)
    app.send_task("tests.echo", kwargs={**body, "attempt": 1})
    tasks.echo.delay("sentinel").settled()
    time.sleep(0.5)
    assert tasks.calls("dup") == 1
    assert transitions(db, handle.job_id).count("claim") == 1


def test_a_foreign_producer_is_claimed_by_insert(worker: object, db: Engine) -> None:
    job_id = uuid.uuid4()
    body = {
        "schema_version": 1,
        "job_id": str(job_id),
        "module": "jobs",
        "attempt": 1,
        "enqueued_at": "2026-11-30T00:00:00+00:00",
        "concurrency_key": "foreign-1",
    }
    app.send_task("tests.tick", kwargs=body)
    row = eventually(lambda: run_count(db) == 1 and run_row(db, job_id))
    row = eventually(lambda: (r := run_row(db, job_id))["state"] == "succeeded" and r)
    assert row["concurrency_key"] == "foreign-1"
    assert tasks.calls(f"tick:{job_id}") == 1
    assert "claimed by insert" in (events(db, job_id)[0]["reason"] or "")


def test_a_foreign_message_for_a_busy_key_is_skipped(worker: object, db: Engine) -> None:
    busy = tasks.keyed.apply_async(kwargs={"account": "b", "token": "busy", "seconds": 2.0})
    eventually(lambda: run_row(db, busy.job_id)["state"] == "running")
    job_id = uuid.uuid4()
    app.send_task(
        "tests.tick",
        kwargs={
            "schema_version": 1,
            "job_id": str(job_id),
            "module": "jobs",
            "attempt": 1,
            "enqueued_at": "2026-11-30T00:00:00+00:00",
            "concurrency_key": "account:b",
        },
    )
    skip = eventually(lambda: [e for e in events(db, job_id) if e["transition"] == "skip"])
    assert str(busy.job_id) in skip[0]["reason"]
    assert run_count(db) == 1


def test_a_message_violating_the_schema_is_rejected(
    worker: object, db: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    app.send_task(
        "tests.echo", kwargs={"schema_version": 1, "job_id": "not-a-uuid", "url": "http://evil/x"}
    )
    app.send_task("tests.echo", args=("positional", "extra"))
    assert tasks.echo.delay("alive").settled()["state"] == "succeeded"
    assert run_count(db) == 1

    # The later echo may settle first (another pool thread): wait for both refusals.
    def refused() -> list[str]:
        return [r.getMessage() for r in caplog.records if "rejected message" in r.getMessage()]

    eventually(lambda: len(refused()) >= 2)
    rejections = refused()
    assert len(rejections) == 2
    assert any("schema violation" in r for r in rejections)
    assert any("positional" in r for r in rejections)


def test_enqueue_in_a_rolled_back_transaction_leaves_nothing(worker: object, db: Engine) -> None:
    with Session(db) as session:
        handle = tasks.echo.apply_async(("rolled",), session=session)
        assert handle.outcome == EnqueueOutcome.ENQUEUED
        session.rollback()
    with db.begin() as conn:
        handle_core = tasks.echo.apply_async(("rolled-core",), connection=conn)
        conn.rollback()
    time.sleep(1.0)
    assert run_count(db) == 0
    assert tasks.calls("rolled") == tasks.calls("rolled-core") == 0
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox")).scalar_one() == 0
    assert handle_core.journal_state is None


def test_enqueue_in_a_committed_session_publishes_after_commit(worker: object, db: Engine) -> None:
    with Session(db) as session:
        handle = tasks.echo.apply_async(("committed",), session=session)
        session.commit()
    assert handle.settled()["state"] == "succeeded"


def test_a_batch_enqueues_with_the_callers_transaction(worker: object, db: Engine) -> None:
    with transaction(app) as batch:
        handles = [tasks.echo.enqueue_in(batch, (f"batch{i}",)) for i in range(5)]
    assert all(h.settled()["state"] == "succeeded" for h in handles)
    assert [tasks.calls(f"batch{i}") for i in range(5)] == [1] * 5


def test_a_failed_batch_leaves_nothing(worker: object, db: Engine) -> None:
    class Abort(Exception):
        pass

    try:
        with transaction(app) as batch:
            tasks.echo.enqueue_in(batch, ("aborted",))
            raise Abort
    except Abort:
        pass
    time.sleep(0.5)
    assert run_count(db) == 0
    assert tasks.calls("aborted") == 0


def test_a_countdown_delays_the_first_attempt_in_the_journal(worker: object, db: Engine) -> None:
    later = tasks.echo.apply_async(("later",), countdown=60)
    soon = tasks.echo.apply_async(("soon",), countdown=1)
    assert soon.settled(timeout=15)["state"] == "succeeded"
    row = run_row(db, later.job_id)
    assert row["state"] == "queued"
    assert row["next_retry_at"] > row["created_at"] + timedelta(seconds=55)
    (message,) = outbox_rows(db, later.job_id)
    assert message["published_at"] is None  # the relay publishes it when due, not the broker
    assert tasks.calls("later") == 0


def test_the_callers_trace_continues_and_unknown_options_are_refused(db: Engine) -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    handle = tasks.echo.apply_async(("traced",), headers={"traceparent": traceparent})
    (message,) = outbox_rows(db, handle.job_id)
    assert message["body"]["traceparent"] == traceparent
    with pytest.raises(TypeError, match="link_error"):
        tasks.echo.apply_async(("refused",), link_error=None)
