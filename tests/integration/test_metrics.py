"""/metrics/cluster counters and histograms: what ran, as an operator's alert rules read it.

Real worker, real relay and rollup passes, scraped through the web app.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import pytest
from celery.worker import state as worker_state
from sqlalchemy import Engine, delete, select

from jobsapp.celery_app import app
from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal.outbox_queries import COUNTERS
from jobsapp.lifecycle.journal.tables import OutboxMessage
from jobsapp.lifecycle.rules.states import Outcome, State
from jobsapp.lifecycle.task import LifecycleTask
from jobsapp.maintenance import reaper, relay
from jobsapp.monitor import rollup
from jobsapp.web.app import create_app
from tests.support import tasks
from tests.support.attachments import environment
from tests.support.journal_view import run_row
from tests.support.waiting import eventually
from tests.support.web import sample, scrape


@pytest.fixture
def fresh_totals(db: Engine) -> Engine:
    """Totals and the rollup's cursor start at zero (the journal is emptied per test)."""
    with db.begin() as conn:
        conn.execute(delete(rollup.TOTALS))
        conn.execute(delete(COUNTERS))
    return db


def _unpublished(db: Engine) -> list[uuid.UUID]:
    table = OutboxMessage.__table__
    with db.connect() as conn:
        return list(
            conn.execute(select(table.c.job_id).where(table.c.published_at.is_(None))).scalars()
        )


def test_attempts_outcomes_histograms_dedup_and_relay_are_counted_once(
    worker: object, fresh_totals: Engine
) -> None:
    db = fresh_totals
    for n in range(2):
        tasks.echo.apply_async((f"metrics-{n}",)).settled()
    tasks.doomed.apply_async(("metrics-doomed",)).settled()
    job_id = uuid.uuid4()
    for _ in range(2):
        duplicate = tasks.windowed.apply_async(("metrics-dup",), job_id=job_id)
    duplicate.settled()
    with db.begin() as conn:
        relayed = tasks.echo.apply_async(("metrics-relayed",), connection=conn)
    # The fast path marks its rows published a moment after the broker took them: until
    # then a relay with no grace would send them again too.
    eventually(lambda: _unpublished(db) == [relayed.job_id])
    assert relay.run_once(app, db, relay.RelayConfig(grace=timedelta(0)))["published"] == 1
    relayed.settled()

    counted = rollup.run_once(db, settle=timedelta(0))
    assert counted > 0
    assert rollup.run_once(db, settle=timedelta(0)) == 0  # a second pass adds nothing
    got = scrape()

    echo = {"module": "jobs", "task": "tests.echo"}
    doomed = {"module": "jobs", "task": "tests.doomed"}
    assert sample(got, "jobsapp_attempts_total", **echo, outcome="succeeded") == 3
    assert sample(got, "jobsapp_attempts_total", **doomed, outcome="retried") == 1
    assert sample(got, "jobsapp_attempts_total", **doomed, outcome="failed") == 1
    assert sample(got, "jobsapp_run_duration_seconds_count", **echo) == 3
    assert sample(got, "jobsapp_run_duration_seconds_bucket", **echo, le="+Inf") == 3
    assert sample(got, "jobsapp_queue_wait_seconds_count", **doomed) == 2
    assert 0 < sample(got, "jobsapp_queue_wait_seconds_sum", **echo) < 60
    assert sample(got, "jobsapp_dedup_hits_total", module="jobs", task="tests.windowed") == 1
    assert sample(got, "jobsapp_relay_messages_total", result="published") == 1
    assert sample(got, "jobsapp_relay_messages_total", result="dead") == 0
    # The gauges stay.
    assert ("jobsapp_outbox_backlog", frozenset()) in got


def _cancelled(db: Engine, job_id: uuid.UUID) -> bool:
    row = run_row(db, job_id)
    return (row["state"], row["outcome"]) == (State.FAILED, Outcome.CANCELLED)


def _reaped_cancelled(db: Engine, job_id: uuid.UUID) -> bool:
    reaper.run_once(db, reaper.ReaperConfig(stale_after=timedelta(seconds=1)), app)
    return _cancelled(db, job_id)


def test_a_revoked_running_attempt_counts_cancelled_whoever_ended_it(
    worker: object, fresh_totals: Engine
) -> None:
    db = fresh_totals
    # Its worker stops this one at a beat; the other sleeps through its beats, and the
    # reaper ends it once its heartbeat is stale: the journal says cancelled for both.
    stopped = tasks.looping.delay(token := uuid.uuid4().hex, 60.0)
    sleeper = tasks.windowed_slow.delay(nap := uuid.uuid4().hex, 3.0)
    eventually(lambda: tasks.calls(token) == tasks.calls(nap) == 1)
    eventually(lambda: run_row(db, sleeper.job_id)["state"] == State.RUNNING)
    for handle in (stopped, sleeper):
        app.control.revoke(handle.id)
    eventually(lambda: _cancelled(db, stopped.job_id))
    eventually(lambda: _reaped_cancelled(db, sleeper.job_id))
    # The sleeper's body wakes to find its end written; what it does then changes nothing.
    eventually(lambda: not worker_state.active_requests)
    assert _cancelled(db, sleeper.job_id)

    rollup.run_once(db, settle=timedelta(0))
    got = scrape()

    for name in ("tests.windowed_slow", "tests.looping"):
        mine = {"module": "jobs", "task": name}
        assert sample(got, "jobsapp_attempts_total", **mine, outcome="cancelled") == 1
        assert sample(got, "jobsapp_attempts_total", **mine, outcome="reaped") == 0
        assert sample(got, "jobsapp_reaped_total", **mine, outcome="failed") == 0


def test_metrics_need_the_scrapers_token_when_one_is_set(fresh_totals: Engine) -> None:
    with environment(JOBSAPP_METRICS_TOKEN="scrape-me-7f3a9c2e5b1d8064-metrics"):
        client = create_app().test_client()
        for path in ("/metrics", "/metrics/cluster"):
            assert client.get(path).status_code == 401
            bad = client.get(path, headers={"Authorization": "Bearer nope"})
            assert bad.status_code == 401
            assert "jobsapp-metrics" in bad.headers["WWW-Authenticate"]
            assert scrape({"Authorization": "Bearer scrape-me-7f3a9c2e5b1d8064-metrics"}, path)


def test_every_counter_of_every_registered_task_has_a_zero_series_before_any_job(
    fresh_totals: Engine,
) -> None:
    got = scrape()

    registered = [t for t in app.tasks.values() if isinstance(t, LifecycleTask)]
    assert len(registered) > 5
    for task in registered:
        mine = {"module": task.run_table.module, "task": task.name}
        for outcome in ("succeeded", "retried", "snoozed", "failed", "reaped", "cancelled"):
            assert (
                "jobsapp_attempts_total",
                frozenset({**mine, "outcome": outcome}.items()),
            ) in got
        for outcome in ("requeued", "failed"):
            assert ("jobsapp_reaped_total", frozenset({**mine, "outcome": outcome}.items())) in got
        assert ("jobsapp_dedup_hits_total", frozenset(mine.items())) in got
        for histogram in ("jobsapp_queue_wait_seconds", "jobsapp_run_duration_seconds"):
            assert (f"{histogram}_count", frozenset(mine.items())) in got
        # A task declared with a queue of its own (another module may register one) is
        # counted on it; the others on the default queue.
        queue = {"queue": getattr(task, "queue", None) or app.conf.task_default_queue}
        assert ("jobsapp_oldest_queued_seconds", frozenset({**mine, **queue}.items())) in got
    assert not any(
        v for (name, _), v in got.items() if name.endswith(("_total", "_count", "_bucket"))
    )


def test_task_and_queue_labels_say_only_registered_tasks_and_configured_queues(
    fresh_totals: Engine,
) -> None:
    db = fresh_totals
    routed = tasks.echo.new_job(("to-a-queue",), {}, None)
    stray = replace(tasks.echo.new_job(("stray",), {}, None), queue=f"tenant-{uuid.uuid4()}")
    renamed = replace(
        tasks.echo.new_job(("renamed",), {}, None), task_name=f"gone.{uuid.uuid4().hex}"
    )
    with db.begin() as conn:
        for job in (routed, stray, renamed):
            journal.enqueue(conn, job, now=utcnow(), actor="producer")
        rollup.add(conn, {(rollup.ATTEMPTS, "jobs", renamed.task_name, "succeeded"): 2})

    got = scrape()

    default = app.conf.task_default_queue

    def queued(task: str, queue: str) -> float:
        return sample(got, "jobsapp_jobs", module="jobs", task=task, queue=queue, state="queued")

    assert queued("tests.echo", default) == 1
    assert queued("tests.echo", "other") == 1
    assert queued("other", default) == 1
    assert (
        sample(got, "jobsapp_attempts_total", module="jobs", task="other", outcome="succeeded") == 2
    )
    assert (
        "jobsapp_oldest_queued_seconds",
        frozenset({"module": "jobs", "task": "other", "queue": default}.items()),
    ) in got
    assert not any(
        stray.queue in str(labels) or renamed.task_name in str(labels) for _, labels in got
    )


def test_metrics_is_the_process_and_metrics_cluster_is_the_journal(fresh_totals: Engine) -> None:
    process = {name for name, _ in scrape(path="/metrics")}
    cluster = {name for name, _ in scrape()}

    assert {"process_cpu_seconds_total", "python_info", "jobsapp_web_info"} <= process
    assert not any(name.startswith("jobsapp_") and name != "jobsapp_web_info" for name in process)
    assert {"jobsapp_jobs", "jobsapp_attempts_total", "jobsapp_outbox_backlog"} <= cluster
    assert not any(name.startswith(("process_", "python_")) for name in cluster)


def test_one_rollup_pass_counts_more_than_a_page_of_successes(
    worker: object, fresh_totals: Engine
) -> None:
    """The rollup counted one page a tick (2,000 successes per 15 s, about 133 a second),
    below the rate docs/scaling.md plans for: a pass drains page after page (issue 37)."""
    for n in range(7):
        tasks.echo.apply_async((f"pages-{n}",)).settled()
    rollup.run_once(fresh_totals, batch=2, settle=timedelta(0))
    echo = {"module": "jobs", "task": "tests.echo"}
    assert sample(scrape(), "jobsapp_attempts_total", **echo, outcome="succeeded") == 7
