"""One maintenance pass at a time, called directly on planted rows, on Postgres and SQLite.

What an operator would check after a pass: which runs the reaper took and why, which
rows the relay published (and what reached the broker), what retention deleted. The
relay publishes to a real Redis, database 4, with an app of its own, so no other test's
worker consumes what it sends.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
from celery import Celery, chain
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, func, insert, select, text, update

from jobsapp import db as jobsapp_db
from jobsapp import operator
from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import EVENTS, OUTBOX, StaleRun, outbox_queries, registry
from jobsapp.lifecycle.journal.tables import JobRun
from jobsapp.lifecycle.journal.workflow import STEPS
from jobsapp.lifecycle.producer.enqueue import transaction
from jobsapp.lifecycle.rules.message import task_id_for
from jobsapp.lifecycle.rules.states import Outcome
from jobsapp.lifecycle.transport import outbox, publisher
from jobsapp.maintenance import lease, reaper, relay, retention
from jobsapp.monitor import metrics, summary
from jobsapp.monitor.workflows import workflow_counts
from tests.support import canvas_tasks, tasks
from tests.support.env import service
from tests.support.journal_view import held_by, outbox_rows, run_row, transitions
from tests.support.planted import ago, enqueue, poisoned, rolled_up, set_outbox, set_row, start
from tests.support.servers import RedisServer
from tests.support.waiting import eventually

RUNS = JobRun.__table__


def cluster_registry(db: Engine) -> CollectorRegistry:
    return metrics.journal_registry(lambda: db, lambda: 30.0, metrics.celery_app)


def cluster_scrape(db: Engine) -> str:
    return metrics.exposition(cluster_registry(db)).decode()


JOBS = registry.JOBS
STALE = timedelta(seconds=30)
UNCLAIMED = timedelta(seconds=60)
REAPER = reaper.ReaperConfig(stale_after=STALE, unclaimed_after=UNCLAIMED)
RELAY = relay.RelayConfig(unclaimed_after=UNCLAIMED)


@pytest.fixture
def broker(module_redis: RedisServer) -> Iterator[redis.Redis]:
    client = module_redis.client()
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def relay_app(broker: redis.Redis, module_redis: RedisServer) -> Iterator[Celery]:
    """A producer-only app on the broker of this module."""
    app = Celery("maintenance-relay-tests", broker=module_redis.url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"])
    yield app
    app.close()


def queued_task_ids(broker: redis.Redis) -> list[str]:
    return [json.loads(m)["headers"]["id"] for m in broker.lrange("celery", 0, -1)]


def reap_events(db: Engine, job_id: uuid.UUID) -> list[str]:
    return [t for t in transitions(db, job_id) if t.startswith("reap")]


# ------------------------------------------------------------------ reaper


def test_the_reaper_requeues_dead_runs_and_leaves_the_rest(db: Engine) -> None:
    dead = start(db, at=ago(120))
    alive = start(db, at=ago(120))
    set_row(db, alive, heartbeat_at=ago(1))
    finished = start(db, at=ago(120))
    with db.begin() as conn:
        journal.succeed(
            conn, JOBS, finished, 1, token=held_by(conn, JOBS, finished), actor="w", now=ago(100)
        )
    waiting = enqueue(db, at=ago(120))

    assert reaper.run_once(db, REAPER)[JOBS.module] == 1

    row = run_row(db, dead)
    assert (row["state"], row["attempts"], row["rescues"]) == ("queued", 1, 1)
    assert row["heartbeat_at"] is None
    assert row["last_error"] == "heartbeat older than 30s: the worker died or froze; requeued"
    assert reap_events(db, dead) == ["reap_requeue"]
    # The next attempt's message waits in the outbox (no app given: the relay sends it).
    second = [m for m in outbox_rows(db, dead) if m["attempt"] == 2]
    assert [m["published_at"] for m in second] == [None]
    for untouched, state in ((alive, "running"), (finished, "succeeded"), (waiting, "queued")):
        assert run_row(db, untouched)["state"] == state
        assert reap_events(db, untouched) == []


def test_the_reaper_publishes_the_attempts_it_requeued(
    db: Engine, relay_app: Celery, broker: redis.Redis
) -> None:
    dead = start(db, at=ago(120))
    reaper.run_once(db, REAPER, relay_app)
    (second,) = [m for m in outbox_rows(db, dead) if m["attempt"] == 2]
    assert second["publish_count"] == 1
    # Its claim is checked one unclaimed timeout after the publish.
    check = second["available_at"] - second["published_at"]
    assert abs(check - UNCLAIMED) < timedelta(seconds=1)
    assert queued_task_ids(broker) == [task_id_for(dead, 2)]
    # The relay, right after, finds nothing left to publish.
    assert relay.run_once(relay_app, db, RELAY)["published"] == 0
    assert queued_task_ids(broker) == [task_id_for(dead, 2)]


def test_the_reaper_fails_runs_past_their_ceilings(db: Engine) -> None:
    poison = start(db, at=ago(120))
    set_row(db, poison, rescues=JOBS.rescue_limit)
    spent = start(db, at=ago(120), max_attempts=1)

    assert reaper.run_once(db, REAPER)[JOBS.module] == 2

    for job_id, why in ((poison, "a job that kills its worker"), (spent, "no attempts left")):
        row = run_row(db, job_id)
        assert (row["state"], row["outcome"]) == ("failed", "stale")
        assert row["finished_at"] is not None
        assert why in row["last_error"]
        assert reap_events(db, job_id) == ["reap_fail"]
        assert [m["attempt"] for m in outbox_rows(db, job_id)] == [1]


def test_a_pass_is_bounded_and_the_next_goes_on(db: Engine) -> None:
    dead = [start(db, at=ago(120 + i)) for i in range(5)]
    small = reaper.ReaperConfig(stale_after=STALE, batch=2, max_batches=2)
    assert reaper.run_once(db, small)[JOBS.module] == 4
    assert reaper.run_once(db, small)[JOBS.module] == 1
    assert reaper.run_once(db, small)[JOBS.module] == 0
    assert all(reap_events(db, job_id) == ["reap_requeue"] for job_id in dead)


def _snapshot(db: Engine) -> list[StaleRun]:
    with db.begin() as conn:
        return journal.find_stale(conn, JOBS, cutoff=utcnow() - STALE, limit=10)


def _reap_with(monkeypatch: pytest.MonkeyPatch, db: Engine, seen: list[StaleRun]) -> int:
    """A pass that decides on ``seen``: what it read before the rows changed under it."""
    monkeypatch.setattr(journal, "find_stale", lambda *_a, **_k: seen)
    return reaper.run_once(db, REAPER)[JOBS.module]


def test_a_run_that_heartbeated_after_the_reaper_looked_is_left_alone(
    db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = start(db, at=ago(120))
    seen = _snapshot(db)
    assert [r.job_id for r in seen] == [job_id]
    with db.begin() as conn:
        assert journal.heartbeat(
            conn, JOBS, job_id, 1, token=held_by(conn, JOBS, job_id), now=utcnow()
        )

    assert _reap_with(monkeypatch, db, seen) == 0
    row = run_row(db, job_id)
    assert (row["state"], row["attempts"], row["rescues"]) == ("running", 1, 0)
    assert reap_events(db, job_id) == []
    assert [m["attempt"] for m in outbox_rows(db, job_id)] == [1]


def test_a_run_that_finished_after_the_reaper_looked_keeps_its_outcome(
    db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = start(db, at=ago(120))
    seen = _snapshot(db)
    with db.begin() as conn:
        assert journal.succeed(
            conn, JOBS, job_id, 1, token=held_by(conn, JOBS, job_id), actor="w", now=utcnow()
        )

    assert _reap_with(monkeypatch, db, seen) == 0
    row = run_row(db, job_id)
    assert (row["state"], row["outcome"], row["last_error"]) == ("succeeded", "succeeded", None)
    assert reap_events(db, job_id) == []


def test_a_run_rescued_and_claimed_again_is_not_reaped_for_its_old_attempt(
    db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = start(db, at=ago(120))
    seen = _snapshot(db)
    # Another reaper took attempt 1, and attempt 2 started, and looks stale as well.
    assert reaper.run_once(db, REAPER)[JOBS.module] == 1
    with db.begin() as conn:
        assert journal.claim(conn, JOBS, job_id, 2, worker="w@h:2", now=ago(60)) is not None

    assert _reap_with(monkeypatch, db, seen) == 0
    row = run_row(db, job_id)
    assert (row["state"], row["attempts"], row["rescues"]) == ("running", 2, 1)
    assert reap_events(db, job_id) == ["reap_requeue"]


# ------------------------------------------------------------------ relay


def test_the_relay_publishes_a_crashed_producers_row_once(
    db: Engine, relay_app: Celery, broker: redis.Redis
) -> None:
    job_id = enqueue(db, at=ago(10))
    assert relay.run_once(relay_app, db, RELAY)["published"] == 1
    (row,) = outbox_rows(db, job_id)
    assert row["publish_count"] == 1
    assert queued_task_ids(broker) == [task_id_for(job_id, 1)]
    # A second pass sees a published row whose check is not due: nothing is sent again.
    assert not any(relay.run_once(relay_app, db, RELAY).values())
    assert queued_task_ids(broker) == [task_id_for(job_id, 1)]


def test_a_fresh_row_is_left_to_its_producer(
    db: Engine, relay_app: Celery, broker: redis.Redis
) -> None:
    job_id = enqueue(db, at=utcnow())
    assert relay.run_once(relay_app, db, RELAY)["published"] == 0
    assert outbox_rows(db, job_id)[0]["published_at"] is None
    assert broker.llen("celery") == 0


def test_an_unclaimed_message_is_republished_with_a_longer_check(
    db: Engine, relay_app: Celery, broker: redis.Redis
) -> None:
    job_id = enqueue(db, at=ago(600))
    set_outbox(db, job_id, 1, published_at=ago(600), publish_count=1, available_at=ago(1))

    assert relay.run_once(relay_app, db, RELAY)["republished"] == 1
    (row,) = outbox_rows(db, job_id)
    assert row["publish_count"] == 2
    assert abs(row["available_at"] - row["published_at"] - 2 * UNCLAIMED) < timedelta(seconds=1)
    assert queued_task_ids(broker) == [task_id_for(job_id, 1)]


def test_the_relay_marks_delivered_the_rows_whose_job_moved_on(
    db: Engine, relay_app: Celery, broker: redis.Redis
) -> None:
    running = start(db, at=ago(600))
    finished = start(db, at=ago(600))
    with db.begin() as conn:
        journal.succeed(
            conn, JOBS, finished, 1, token=held_by(conn, JOBS, finished), actor="w", now=ago(500)
        )
    pruned = enqueue(db, at=ago(600))
    with db.begin() as conn:
        conn.execute(RUNS.delete().where(RUNS.c.job_id == pruned))
    not_due = enqueue(db, at=ago(600))
    for job_id in (running, finished, pruned):
        set_outbox(
            db,
            job_id,
            1,
            published_at=ago(600),
            publish_count=1,
            available_at=ago(1),
            delivered_at=None,
        )
    set_outbox(
        db, not_due, 1, published_at=ago(5), publish_count=1, available_at=utcnow() + UNCLAIMED
    )

    counts = relay.run_once(relay_app, db, RELAY)
    assert (counts["settled"], counts["republished"]) == (3, 0)
    for job_id in (running, finished, pruned):
        (row,) = outbox_rows(db, job_id)
        assert row["delivered_at"] is not None
        assert row["publish_count"] == 1
    assert outbox_rows(db, not_due)[0]["delivered_at"] is None
    assert broker.llen("celery") == 0
    # Settled rows are never looked at again.
    assert relay.run_once(relay_app, db, RELAY)["settled"] == 0


def test_the_relay_drains_a_backlog_in_one_pass(
    db: Engine, relay_app: Celery, broker: redis.Redis
) -> None:
    ids = [enqueue(db, at=ago(60)) for _ in range(7)]
    small = relay.RelayConfig(unclaimed_after=UNCLAIMED, batch=3, max_batches=5)
    assert relay.run_once(relay_app, db, small)["published"] == 7
    assert sorted(queued_task_ids(broker)) == sorted(task_id_for(j, 1) for j in ids)


def test_rows_of_a_transaction_longer_than_the_grace_are_published_once(
    pg: Engine, relay_app: Celery, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    grace = timedelta(seconds=1)
    cfg = relay.RelayConfig(grace=grace, unclaimed_after=UNCLAIMED)
    passes: list[dict[str, int]] = []
    fast_path = outbox.publish_now

    def relay_runs_first(app: Celery, messages: Any) -> int:
        # Beat's pass lands between the producer's COMMIT and its publish.
        passes.append(relay.run_once(relay_app, pg, cfg))
        return fast_path(app, messages)

    monkeypatch.setattr(outbox, "publish_now", relay_runs_first)
    with transaction(relay_app) as batch:
        open_for = select(func.clock_timestamp() - func.now())
        eventually(lambda: batch.conn.execute(open_for).scalar_one() > 2 * grace)
        handle = tasks.echo.enqueue_in(batch, ("long",))

    assert passes[0]["published"] == 0
    outbox.MARKER.flush()
    eventually(lambda: outbox_rows(pg, handle.job_id)[0]["published_at"] is not None)
    assert relay.run_once(relay_app, pg, cfg)["published"] == 0
    assert queued_task_ids(broker) == [task_id_for(handle.job_id, 1)]


# ------------------------------------------------------------------ retention


def _count(db: Engine, table: Any, *where: Any) -> int:
    with db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one())


def test_retention_deletes_only_what_has_aged_out(db: Engine) -> None:
    days = 86_400
    old_done = start(db, at=ago(9 * days))
    with db.begin() as conn:
        journal.succeed(
            conn,
            JOBS,
            old_done,
            1,
            token=held_by(conn, JOBS, old_done),
            actor="w",
            now=ago(8 * days),
        )
    old_failed = start(db, at=ago(9 * days))
    with db.begin() as conn:
        journal.fail(
            conn,
            JOBS,
            old_failed,
            1,
            token=held_by(conn, JOBS, old_failed),
            outcome=Outcome.PERMANENT,
            error="x",
            actor="w",
            now=ago(8 * days),
        )
    recent_done = start(db, at=ago(2 * days))
    with db.begin() as conn:
        journal.succeed(
            conn,
            JOBS,
            recent_done,
            1,
            token=held_by(conn, JOBS, recent_done),
            actor="w",
            now=ago(days),
        )
    old_running = start(db, at=ago(9 * days))
    old_queued = enqueue(db, at=ago(9 * days))

    set_outbox(db, old_done, 1, published_at=ago(3 * days), delivered_at=ago(2 * days))
    set_outbox(db, recent_done, 1, published_at=ago(days), delivered_at=ago(3600))
    set_outbox(db, old_running, 1, published_at=ago(3 * days), delivered_at=None)  # unsettled
    # old_failed's row was delivered 9 days ago; old_queued's was never published.
    with db.begin() as conn:
        conn.execute(update(EVENTS).where(EVENTS.c.job_id == old_running).values(at=ago(31 * days)))
    events_before = _count(db, EVENTS)
    old_events = _count(db, EVENTS, EVENTS.c.job_id == old_running)

    counts = retention.run_once(db, retention.RetentionConfig())

    assert counts[JOBS.module] == 2
    assert set(_ids(db, RUNS.c.job_id)) == {recent_done, old_running, old_queued}
    assert counts["outbox"] == 2
    assert {r["job_id"] for r in _outbox(db)} == {recent_done, old_running, old_queued}
    assert counts["job_events"] == old_events
    assert _count(db, EVENTS) == events_before - old_events


def _ids(db: Engine, column: Any) -> list[Any]:
    with db.connect() as conn:
        return list(conn.execute(select(column)).scalars())


def _outbox(db: Engine) -> list[Any]:
    with db.connect() as conn:
        return list(conn.execute(select(OUTBOX)).mappings())


def test_retention_is_bounded_by_its_batch(db: Engine) -> None:
    ids = [start(db, at=ago(10 * 86_400)) for _ in range(5)]
    with db.begin() as conn:
        for job_id in ids:
            journal.succeed(
                conn,
                JOBS,
                job_id,
                1,
                token=held_by(conn, JOBS, job_id),
                actor="w",
                now=ago(9 * 86_400),
            )
        conn.execute(
            insert(EVENTS),
            [
                {
                    "module": "jobs",
                    "job_id": ids[0],
                    "attempt": 1,
                    "transition": "claim",
                    "actor": "w",
                    "at": ago(40 * 86_400),
                }
                for _ in range(5)
            ],
        )
    small = retention.RetentionConfig(batch=2, max_batches=1)
    firsts = retention.run_once(db, small)
    assert (firsts[JOBS.module], firsts["job_events"]) == (2, 2)
    seconds = retention.run_once(db, small)
    assert (seconds[JOBS.module], seconds["job_events"]) == (2, 2)
    assert retention.run_once(db, small)[JOBS.module] == 1
    assert _count(db, RUNS) == 0


def test_one_retention_pass_drains_more_than_one_batch(db: Engine) -> None:
    """A busy journal ages out more than a batch per tick: one pass cuts batch after batch
    until nothing more is due, so pruning keeps up with what the journal adds."""
    ids = [start(db, at=ago(10 * 86_400)) for _ in range(7)]
    with db.begin() as conn:
        for job_id in ids:
            journal.succeed(
                conn,
                JOBS,
                job_id,
                1,
                token=held_by(conn, JOBS, job_id),
                actor="w",
                now=ago(9 * 86_400),
            )
    counts = retention.run_once(db, retention.RetentionConfig(batch=2))
    assert counts[JOBS.module] == 7
    assert _count(db, RUNS) == 0


# ------------------------------------------------------------------ beat's lease


def test_one_holder_at_a_time_and_takeover_after_expiry(db: Engine) -> None:
    ttl = timedelta(seconds=3)
    now = utcnow()

    def take(holder: str, at: datetime) -> bool:
        with db.begin() as conn:
            return lease.acquire(conn, "beat", holder, ttl=ttl, now=at)

    assert take("a", now)
    assert not take("b", now + timedelta(seconds=1))
    assert take("a", now + timedelta(seconds=2))  # renewed: the lease runs from here
    assert not take("b", now + timedelta(seconds=4))
    assert take("b", now + timedelta(seconds=5.5))
    assert not take("a", now + timedelta(seconds=6))  # the old leader stands by
    with db.begin() as conn:
        lease.release(conn, "beat", "a")  # not its lease any more: nothing happens
        holder = lease.holder_of(conn, "beat")
    assert holder is not None
    assert holder[0] == "b"
    with db.begin() as conn:
        lease.release(conn, "beat", "b")
        assert lease.holder_of(conn, "beat") is None


def test_the_lease_runs_on_the_database_clock(db: Engine) -> None:
    with db.begin() as conn:
        clock = lease.database_now(conn)
        assert lease.acquire(conn, "beat", "a", ttl=timedelta(seconds=3), now=clock)
    assert clock.utcoffset() == timedelta(0)
    assert abs(clock - utcnow()) < timedelta(seconds=5)  # same host: the clocks agree


# ------------------------------------------------------------------ two relays at once


def test_two_relays_settling_at_once_mark_each_row_once(pg: Engine) -> None:
    job_id = start(pg, at=ago(600))
    set_outbox(pg, job_id, 1, published_at=ago(600), available_at=ago(1), delivered_at=None)
    settled: dict[str, int] = {}

    def second_relay() -> None:
        with pg.begin() as conn:
            conn.exec_driver_sql("SET application_name = 'second-relay'")
            settled["second"] = outbox_queries.settle_delivered(conn, JOBS, now=utcnow(), limit=10)

    with pg.begin() as first:
        settled["first"] = outbox_queries.settle_delivered(first, JOBS, now=utcnow(), limit=10)
        other = threading.Thread(target=second_relay)
        other.start()
        # The second relay now waits on the row the first one holds.
        eventually(lambda: _waiting(pg, "second-relay"), timeout=10)
    other.join(timeout=10)
    assert settled == {"first": 1, "second": 0}


def _waiting(db: Engine, application: str) -> bool:
    with db.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE application_name = :app AND wait_event_type = 'Lock'"
                ),
                {"app": application},
            ).scalar_one()
        )


# ------------------------------------------------------------------ poison outbox rows


def test_rows_that_fail_on_their_own_back_off_and_newer_rows_are_published(
    db: Engine, relay_app: Celery, broker: redis.Redis
) -> None:
    # A whole batch of poison, older than the good row: first in every batch.
    poison = [enqueue(db, at=ago(120 + i)) for i in range(3)]
    for job_id in poison:
        poisoned(db, job_id)
    good = enqueue(db, at=ago(60))
    small = relay.RelayConfig(unclaimed_after=UNCLAIMED, batch=3)

    assert relay.run_once(relay_app, db, small)["published"] == 1
    assert queued_task_ids(broker) == [task_id_for(good, 1)]
    for job_id in poison:
        (row,) = outbox_rows(db, job_id)
        assert (row["published_at"], row["publish_failures"], row["dead_at"]) == (None, 1, None)
        assert row["last_error"].startswith("InvalidMessage: schema violation")
        # Backed off: the next tick does not try it again.
        assert row["available_at"] > utcnow() + timedelta(seconds=5)
    assert not any(relay.run_once(relay_app, db, small).values())


def test_a_row_that_keeps_failing_is_dead_listed_counted_and_retried_by_an_operator(
    db: Engine, relay_app: Celery, broker: redis.Redis
) -> None:
    job_id = enqueue(db, at=ago(60))
    body = poisoned(db, job_id, publish_failures=outbox.MAX_PUBLISH_FAILURES - 1)

    assert relay.run_once(relay_app, db, RELAY)["dead"] == 1
    (row,) = outbox_rows(db, job_id)
    assert row["dead_at"] is not None
    assert row["publish_failures"] == outbox.MAX_PUBLISH_FAILURES
    set_outbox(db, job_id, 1, available_at=ago(1))
    assert not any(relay.run_once(relay_app, db, RELAY).values())  # dead: never tried again
    with db.connect() as conn:
        assert [r.job_id for r in outbox_queries.dead_rows(conn, limit=10)] == [job_id]
    scraped = cluster_scrape(db)
    assert "jobsapp_outbox_dead 1.0" in scraped
    assert summary.outbox_backlog(db) == 0  # dead is not backlog

    # The cause is fixed (a deploy); the operator gives the row back to the relay.
    set_outbox(db, job_id, 1, body=body)
    assert (
        operator.retry_dead_outbox(db, None, actor="ops", reason="schema fixed", app=relay_app) == 1
    )
    outbox.MARKER.flush()  # the fast path marks its rows in bulk, a moment after publishing
    (row,) = outbox_rows(db, job_id)
    assert (row["dead_at"], row["publish_failures"], row["publish_count"]) == (None, 0, 1)
    assert queued_task_ids(broker) == [task_id_for(job_id, 1)]
    assert "outbox_retry" in transitions(db, job_id)


def test_a_message_never_claimed_after_many_publishes_is_dead(
    db: Engine, relay_app: Celery, broker: redis.Redis
) -> None:
    job_id = enqueue(db, at=ago(600))
    set_outbox(
        db,
        job_id,
        1,
        published_at=ago(600),
        available_at=ago(1),
        publish_count=outbox.MAX_UNCLAIMED_PUBLISHES,
    )

    assert relay.run_once(relay_app, db, RELAY)["dead"] == 1
    (row,) = outbox_rows(db, job_id)
    assert row["dead_at"] is not None
    assert "never claimed" in row["last_error"]
    assert broker.llen("celery") == 0


@pytest.fixture(params=["redis", "amqp"])
def backlog_app(request: pytest.FixtureRequest, module_redis: RedisServer) -> Iterator[Celery]:
    """A producer-only app on a queue of its own that no worker consumes (a backlog)."""
    url = module_redis.url if request.param == "redis" else service("JOBSAPP_TEST_AMQP_URL")
    app = Celery("backlog-tests", broker=url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_default_queue=f"backlog-{uuid.uuid4().hex}",
    )
    yield app
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(app.conf.task_default_queue)
    app.close()


def _depth(app: Celery) -> int:
    with app.connection_for_write() as conn:
        return int(
            conn.default_channel.queue_declare(
                app.conf.task_default_queue, passive=True
            ).message_count
        )


def test_a_job_waiting_behind_a_backlog_is_neither_copied_nor_dead(
    pg: Engine, backlog_app: Celery
) -> None:
    ids = [enqueue(pg, at=ago(600)) for _ in range(5)]
    assert relay.run_once(backlog_app, pg, RELAY)["published"] == 5
    eventually(lambda: _depth(backlog_app) == 5)

    # Every claim check comes due while the messages still wait in the queue.
    for _ in range(outbox.MAX_UNCLAIMED_PUBLISHES + 2):
        for job_id in ids:
            set_outbox(pg, job_id, 1, available_at=ago(1))
        counts = relay.run_once(backlog_app, pg, RELAY)
        assert (counts["republished"], counts["dead"]) == (0, 0)
    assert _depth(backlog_app) == 5
    for job_id in ids:
        (row,) = outbox_rows(pg, job_id)
        assert (row["publish_count"], row["dead_at"]) == (1, None)
        assert row["available_at"] > utcnow()  # checked again later

    # The broker loses them: the next check republishes each once.
    with backlog_app.connection_for_write() as conn:
        conn.default_channel.queue_purge(backlog_app.conf.task_default_queue)
    for job_id in ids:
        set_outbox(pg, job_id, 1, available_at=ago(1))
    assert relay.run_once(backlog_app, pg, RELAY)["republished"] == 5
    eventually(lambda: _depth(backlog_app) == 5)


def test_a_dead_row_whose_run_then_ran_is_settled(
    db: Engine, relay_app: Celery, broker: redis.Redis
) -> None:
    job_id = enqueue(db, at=ago(600))
    set_outbox(
        db,
        job_id,
        1,
        published_at=ago(600),
        available_at=ago(1),
        publish_count=outbox.MAX_UNCLAIMED_PUBLISHES,
    )
    assert relay.run_once(relay_app, db, RELAY)["dead"] == 1
    registry = cluster_registry(db)
    assert "jobsapp_outbox_dead 1.0" in metrics.exposition(registry).decode()

    # One of its copies reached a worker after all.
    with db.begin() as conn:
        assert journal.claim(conn, JOBS, job_id, 1, worker="w@h:1", now=utcnow())
        assert journal.succeed(
            conn, JOBS, job_id, 1, token=held_by(conn, JOBS, job_id), actor="w@h:1", now=utcnow()
        )

    assert relay.run_once(relay_app, db, RELAY)["settled"] == 1
    (row,) = outbox_rows(db, job_id)
    assert row["dead_at"] is None
    assert row["delivered_at"] is not None
    assert "jobsapp_outbox_dead 0.0" in metrics.exposition(registry).decode()
    with db.connect() as conn:
        assert outbox_queries.dead_rows(conn, limit=10) == []


# ------------------------------------------------------------------ invariant sweep


def test_a_queued_run_without_a_message_is_repaired_and_counted(
    db: Engine, relay_app: Celery, broker: redis.Redis
) -> None:
    orphan = enqueue(db, at=ago(1))
    with db.begin() as conn:
        conn.execute(OUTBOX.delete().where(OUTBOX.c.job_id == orphan))
    waiting = enqueue(db, at=ago(1))  # has its row: left alone
    # Not due within the test, however slow the machine: the second pass publishes only
    # the repaired row (its 2 s grace ran out under a CPU hog, and it published this too).
    set_outbox(db, waiting, 1, available_at=ago(-3600))

    assert relay.run_once(relay_app, db, RELAY)["repaired"] == 1
    (row,) = outbox_rows(db, orphan)
    assert (row["attempt"], row["published_at"], row["dead_at"]) == (1, None, None)
    assert len(outbox_rows(db, waiting)) == 1
    scraped = cluster_scrape(db)
    assert "jobsapp_outbox_repaired_total 1.0" in scraped
    # Repaired once: the next pass finds the invariant kept, and publishes the message.
    set_outbox(db, orphan, 1, available_at=ago(10))
    counts = relay.run_once(relay_app, db, RELAY)
    assert (counts["repaired"], counts["published"]) == (0, 1)
    assert task_id_for(orphan, 1) in queued_task_ids(broker)


# ------------------------------------------------------------------ beat's clock
# Beat's clock may run ahead of the workers' (a skewed host): the reaper and the relay
# judge heartbeats and due times on the database's clock, as the workers stamp them.

SKEW = timedelta(minutes=10)


def ahead() -> Callable[[], datetime]:
    return lambda: utcnow() + SKEW


@pytest.fixture
def beat_clock_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's clock ten minutes ahead, wherever the passes might read it."""
    skewed = ahead()
    for module in (jobsapp_db, reaper, relay, outbox):
        monkeypatch.setattr(module, "utcnow", skewed, raising=False)


@pytest.mark.usefixtures("beat_clock_ahead")
def test_a_skewed_beat_does_not_reap_a_live_run(pg: Engine) -> None:
    live = start(pg, at=ago(120))
    set_row(pg, live, heartbeat_at=ago(1))
    assert (
        reaper.run_once(pg, reaper.ReaperConfig(stale_after=timedelta(seconds=30)))[JOBS.module]
        == 0
    )
    assert run_row(pg, live)["state"] == "running"


@pytest.mark.usefixtures("beat_clock_ahead")
def test_a_skewed_beat_republishes_nothing_before_its_check_time(
    pg: Engine, relay_app: Celery, broker: redis.Redis
) -> None:
    job_id = enqueue(pg, at=ago(30))
    set_outbox(
        pg,
        job_id,
        1,
        published_at=ago(30),
        publish_count=1,
        available_at=utcnow() + timedelta(seconds=60),
    )
    fresh = enqueue(pg, at=utcnow())  # its producer publishes it (grace)

    counts = relay.run_once(relay_app, pg, RELAY)
    assert (counts["republished"], counts["published"]) == (0, 0)
    assert outbox_rows(pg, job_id)[0]["publish_count"] == 1
    assert outbox_rows(pg, fresh)[0]["published_at"] is None
    assert broker.llen("celery") == 0


@pytest.mark.usefixtures("beat_clock_ahead")
def test_a_skewed_beat_sets_the_claim_check_on_the_database_clock(
    pg: Engine, relay_app: Celery, broker: redis.Redis
) -> None:
    job_id = enqueue(pg, at=ago(30))
    assert relay.run_once(relay_app, pg, RELAY)["published"] == 1
    (row,) = outbox_rows(pg, job_id)
    with pg.connect() as conn:
        now = lease.database_now(conn)
    assert row["published_at"] <= now
    assert abs(row["available_at"] - row["published_at"] - UNCLAIMED) < timedelta(seconds=5)


def test_the_sweep_pages_through_the_queued_runs_and_wraps_around(
    db: Engine, relay_app: Celery
) -> None:
    base = utcnow() - timedelta(seconds=5)
    ids = [enqueue(db, at=base + timedelta(milliseconds=i)) for i in range(5)]
    with db.begin() as conn:
        conn.execute(OUTBOX.delete().where(OUTBOX.c.job_id.in_([ids[0], ids[3]])))
    small = relay.RelayConfig(unclaimed_after=UNCLAIMED, batch=2)

    # Pages of two: [0, 1], [2, 3], [4] and back to the start.
    repaired = [relay.repair_missing(db, JOBS, small).done for _ in range(4)]
    assert repaired == [1, 1, 0, 0]
    assert all(len(outbox_rows(db, job_id)) == 1 for job_id in ids)


@contextmanager
def celery_events(app: Celery) -> Iterator[list[dict[str, Any]]]:
    """Celery's task events on ``app``'s broker, as Flower receives them, from the moment
    the receiver is known to listen."""
    seen: list[dict[str, Any]] = []
    with app.connection_for_read() as conn:
        receiver = app.events.Receiver(conn, handlers={"*": seen.append})
        listening = threading.Thread(target=receiver.capture, kwargs={"wakeup": False}, daemon=True)
        listening.start()
        probe = str(uuid.uuid4())
        with app.events.default_dispatcher() as dispatcher:

            def heard() -> bool:
                dispatcher.send("task-sent", uuid=probe)
                return any(e.get("uuid") == probe for e in seen)

            eventually(heard, timeout=20, interval=0.2)
        try:
            yield seen
        finally:
            receiver.should_stop = True
            listening.join(timeout=10)


def test_the_reaper_tells_celery_each_reaped_attempt_ended(db: Engine, relay_app: Celery) -> None:
    """Flower showed a killed worker's attempt STARTED for good: the journal ended it, but
    no Celery event said so. The reaper now sends the attempt's own task event: a revoked
    run it ends cancelled reads REVOKED, as the journal's result says, not FAILURE."""
    publisher.broker_answered()  # no earlier test's open breaker
    dead = start(db, at=ago(120))
    spent = start(db, at=ago(120), max_attempts=1)
    revoked = start(db, at=ago(120))
    set_row(db, revoked, cancel_requested_at=ago(60))
    with celery_events(relay_app) as seen:
        reaper.run_once(db, REAPER, relay_app)

        def ended(job_id: uuid.UUID) -> dict[str, Any] | None:
            task_id = task_id_for(job_id, 1)
            found = [e for e in seen if e["uuid"] == task_id and e["type"] != "task-sent"]
            return found[0] if found else None

        retried, failed = eventually(lambda: ended(dead)), eventually(lambda: ended(spent))
        stopped = eventually(lambda: ended(revoked))
    assert retried["type"] == "task-retried"
    assert failed["type"] == "task-failed"
    assert "the worker died or froze" in failed["exception"]
    assert stopped["type"] == "task-revoked", stopped
    assert run_row(db, revoked)["outcome"] == Outcome.CANCELLED


def test_the_reapers_event_names_a_send_task_attempt_by_the_callers_id(
    db: Engine, relay_app: Celery
) -> None:
    """A plain ``send_task`` message's first attempt ran under the caller's own task id (the
    job id): the reaper's event names it so, or Flower keeps that task STARTED for good."""
    publisher.broker_answered()
    job = tasks.echo.new_job(("sent",), {}, uuid.uuid4())
    with db.begin() as conn:
        assert journal.claim_by_insert(conn, job, 1, worker="w@h:1", now=ago(120)) is not None
    with celery_events(relay_app) as seen:
        reaper.run_once(db, REAPER, relay_app)
        retried = eventually(
            lambda: next(
                (e for e in seen if e["uuid"] == str(job.job_id) and e["type"] != "task-sent"), None
            )
        )
    assert retried["type"] == "task-retried"


def _workflow_of(db: Engine, job_id: uuid.UUID) -> uuid.UUID:
    workflow_id = run_row(db, job_id)["workflow_id"]
    assert workflow_id is not None
    return uuid.UUID(str(workflow_id))


def _age_workflow(db: Engine, workflow_id: uuid.UUID, days: float) -> None:
    with db.begin() as conn:
        conn.execute(
            update(RUNS)
            .where(RUNS.c.workflow_id == workflow_id)
            .values(finished_at=ago(days * 86_400))
        )
        conn.execute(
            update(STEPS)
            .where(STEPS.c.workflow_id == workflow_id)
            .values(created_at=ago((days + 1) * 86_400))
        )


def _rows_of(db: Engine, workflow_id: uuid.UUID) -> tuple[int, int]:
    """(runs, steps) of a workflow."""
    return (
        _count(db, RUNS, RUNS.c.workflow_id == workflow_id),
        _count(db, STEPS, STEPS.c.workflow_id == workflow_id),
    )


def test_retention_deletes_a_workflow_whole_once_nothing_in_it_moved(
    db: Engine, worker: object
) -> None:
    """Retention deleted a workflow's runs and never its steps: the console then counted
    each step without a run as still to come (``workflows: 5 running`` for good), and the
    steps grew without bound; a workflow still moving lost its finished runs (issue 37)."""
    old, recent, moving = (
        chain(canvas_tasks.add.s(n, n), canvas_tasks.add.s(n)).apply_async() for n in (1, 2, 3)
    )
    assert [r.get(timeout=20) for r in (old, recent, moving)] == [3, 6, 9]
    rolled_up(db)
    assert workflow_counts(db)["succeeded"] == 3
    gone, kept, still = (_workflow_of(db, r.job_id) for r in (old, recent, moving))
    _age_workflow(db, gone, days=8)
    _age_workflow(db, still, days=8)
    with db.begin() as conn:  # its last step waits in the queue (a retry's backoff, say)
        conn.execute(update(RUNS).where(RUNS.c.job_id == moving.job_id).values(state="queued"))

    counts = retention.run_once(db, retention.RetentionConfig())

    assert _rows_of(db, gone) == (0, 0)
    assert _rows_of(db, kept) == (2, 2)
    assert _rows_of(db, still) == (2, 2)
    assert (counts["workflows"], counts[JOBS.module]) == (1, 0)
    # The counted workflow it deleted is no longer counted (the line of jobsapp summary).
    assert workflow_counts(db)["succeeded"] == 2
