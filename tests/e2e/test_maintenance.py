"""Beat, the singleton home of maintenance, proven with real processes.

Postgres (a database of this module's own) and Redis (database 3, the broker and the
test counters) are real; workers, beats, producers and ``jobsapp maintenance run-once``
are real subprocesses killed with SIGKILL where the story says so. Timeouts are short
(heartbeat 0.5 s, stale 2 s, lease 3 s, reaper and relay every second) so the module
runs in about a minute; every process is killed by the ``procs`` finalizer.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, create_engine, func, select, text, update

from jobsapp.db import make_engine, utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import OUTBOX, registry
from jobsapp.lifecycle.journal.tables import JobRun
from jobsapp.maintenance import lease, periodic_slots
from jobsapp.schema import metadata
from tests.support import tasks
from tests.support.env import SESSION, service
from tests.support.journal_view import events, outbox_rows, per_job, run_row, transitions
from tests.support.procs import BIN, Launcher, Supervisor, ready, service_env
from tests.support.servers import RedisServer
from tests.support.waiting import eventually

HEARTBEAT = 0.5
STALE_AFTER = 2.0
LEASE = 3.0
REAPER_EVERY = 1.0
RELAY_EVERY = 1.0
UNCLAIMED_AFTER = 2.0
# Room for beat's own loop (it sleeps up to a second between ticks) and process start-up.
SLACK = 1.5
SETTINGS = {
    "JOBSAPP_HEARTBEAT_INTERVAL": str(HEARTBEAT),
    "JOBSAPP_STALE_AFTER": str(STALE_AFTER),
    "JOBSAPP_UNCLAIMED_AFTER": str(UNCLAIMED_AFTER),
    "JOBSAPP_BEAT_LEASE_SECONDS": str(LEASE),
    "JOBSAPP_REAPER_EVERY": str(REAPER_EVERY),
    "JOBSAPP_RELAY_EVERY": str(RELAY_EVERY),
}
# Per test session: another session running this module must not drop it under us.
DATABASE = f"jobsapp_e2e_maintenance_{SESSION}"
RUNS = JobRun.__table__

pytestmark = pytest.mark.timeout(90)


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def broker_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private ``redis-server``: a database number on the shared one is flushed by every
    other session running this module meanwhile (queue and counters with it)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server.url
    server.close()


@pytest.fixture(scope="module")
def database_url(tmp_path_factory: pytest.TempPathFactory, broker_url: str) -> Iterator[str]:
    """A fresh Postgres database, migrated by the real ``jobsapp db upgrade``."""
    base = service("JOBSAPP_TEST_DATABASE_URL")
    admin = create_engine(base.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{DATABASE}"'))
    url = base.rsplit("/", 1)[0] + f"/{DATABASE}"
    env = service_env(
        database_url=url,
        broker_url=broker_url,
        settings=SETTINGS,
        var_dir=tmp_path_factory.mktemp("e2e-var"),
    )
    done = subprocess.run(
        [str(BIN / "jobsapp"), "db", "upgrade"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def db(database_url: str) -> Iterator[Engine]:
    """This module's journal, emptied (a killed beat's lease row included)."""
    engine = make_engine(database_url)
    with engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    yield engine
    engine.dispose()


@pytest.fixture
def broker(broker_url: str) -> Iterator[redis.Redis]:
    """The module's Redis, flushed: the broker queue, unacked messages and counters."""
    client = redis.Redis.from_url(broker_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def procs(
    db: Engine, broker: redis.Redis, broker_url: str, database_url: str, tmp_path: Path
) -> Iterator[Launcher]:
    env = service_env(
        database_url=database_url,
        broker_url=broker_url,
        var_dir=tmp_path / "var",
        settings=SETTINGS,
    )
    launcher = Launcher(env, tmp_path)
    try:
        yield launcher
    finally:
        launcher.kill_all()
        launcher.dump_logs()


# ------------------------------------------------------------------ helpers


def calls(broker: redis.Redis, name: str) -> int:
    return int(broker.get(f"jobsapp-test:calls:{name}") or 0)


def terminal(db: Engine, job_id: uuid.UUID, timeout: float) -> Mapping[str, Any]:
    return eventually(
        lambda: (r := run_row(db, job_id))["state"] in ("succeeded", "failed") and r,
        timeout=timeout,
    )


def first_event(
    db: Engine, job_id: uuid.UUID, transition: str, timeout: float
) -> Mapping[str, Any]:
    found = eventually(
        lambda: [e for e in events(db, job_id) if e["transition"] == transition], timeout=timeout
    )
    return found[0]


def lease_holder(db: Engine) -> str | None:
    with db.connect() as conn:
        return conn.execute(text("SELECT holder FROM leases WHERE name = 'beat'")).scalar()


def plant_stale_runs(db: Engine, count: int, *, age: float = 60.0) -> list[uuid.UUID]:
    """Runs claimed ``age`` seconds ago by a worker that never beat again."""
    then = utcnow() - timedelta(seconds=age)
    ids = [uuid.uuid4() for _ in range(count)]
    with db.begin() as conn:
        for job_id in ids:
            job = tasks.echo.new_job((f"stale-{job_id}",), {}, job_id)
            journal.enqueue(conn, job, now=then, actor="test")
            journal.claim(conn, registry.JOBS, job_id, 1, worker="gone@host:1", now=then)
        # Their first message was published and claimed long ago.
        conn.execute(
            update(OUTBOX)
            .where(OUTBOX.c.job_id.in_(ids))
            .values(published_at=then, publish_count=1, delivered_at=then)
        )
    return ids


def plant_unpublished(db: Engine, count: int, *, age: float = 60.0) -> list[uuid.UUID]:
    """Jobs committed ``age`` seconds ago whose producer never published (crashed)."""
    then = utcnow() - timedelta(seconds=age)
    ids = [uuid.uuid4() for _ in range(count)]
    with db.begin() as conn:
        for job_id in ids:
            job = tasks.echo.new_job((f"pending-{job_id}",), {}, job_id)
            journal.enqueue(conn, job, now=then, actor="test")
    return ids


# ------------------------------------------------------------------ tests


@pytest.mark.serial  # the requeue's delay after the kill is asserted
def test_a_worker_killed_mid_job_is_requeued_and_completed_by_another(
    procs: Launcher, db: Engine, broker: redis.Redis
) -> None:
    beat, first = procs.beat("beat"), procs.worker("first")
    ready(beat, first)
    job_id, token = uuid.uuid4(), f"kill-{uuid.uuid4().hex[:8]}"
    long_job = {"task": "tests.long_first", "kwargs": {"token": token, "seconds": 120}}
    (enqueued,) = procs.enqueue({**long_job, "job_id": job_id})
    assert enqueued["outcome"] == "enqueued"
    row = eventually(lambda: (r := run_row(db, job_id))["state"] == "running" and r)
    assert row["worker"].startswith("first@")
    # While it runs, its concurrency key turns a second job with the same key away.
    (turned_away,) = procs.enqueue(long_job)
    assert (turned_away["outcome"], turned_away["holder"]) == ("skipped", str(job_id))

    second = procs.worker("second")
    ready(second)
    first.kill()
    killed_at = utcnow()

    reap = first_event(db, job_id, "reap_requeue", timeout=STALE_AFTER + REAPER_EVERY + 10)
    # The last heartbeat was at most one interval before the kill, so the run goes stale
    # within the stale limit of the kill, and the next reaper tick takes it.
    delay = (reap["at"] - killed_at).total_seconds()
    print(f"requeued {delay:.2f}s after the kill")
    assert delay <= STALE_AFTER + REAPER_EVERY + SLACK
    assert "the worker died or froze; requeued" in reap["reason"]

    row = terminal(db, job_id, timeout=20)
    assert (row["state"], row["attempts"], row["rescues"]) == ("succeeded", 2, 1)
    assert row["worker"].startswith("second@")
    assert transitions(db, job_id) == ["enqueue", "claim", "reap_requeue", "claim", "succeed"]
    # Each attempt started once; only the completed attempt's effect was recorded.
    started = [calls(broker, f"{token}:started:{n}") for n in (1, 2)]
    done = [calls(broker, f"{token}:done:{n}") for n in (1, 2)]
    assert (started, done) == ([1, 1], [0, 1])

    # The key is free again: the unique index accepts a new job with the same key.
    (again,) = procs.enqueue({**long_job, "kwargs": {"token": token, "seconds": 0.1}})
    assert (again["outcome"], again["holder"]) == ("enqueued", None)


def test_a_job_that_kills_its_worker_every_time_ends_failed_stale(
    procs: Launcher, db: Engine, broker: redis.Redis
) -> None:
    beat = procs.beat("beat")
    supervisor = Supervisor(procs, size=1)
    ready(beat, *supervisor.workers)
    job_id, token = uuid.uuid4(), f"poison-{uuid.uuid4().hex[:8]}"
    (enqueued,) = procs.enqueue(
        {"task": "tests.suicidal", "kwargs": {"token": token}, "job_id": job_id}
    )
    assert enqueued["outcome"] == "enqueued"

    limit = registry.JOBS.rescue_limit
    # Each rescue: the run goes stale, the reaper takes it, and the prefork pool notices
    # its dead child (billiard's maintenance timer runs every 5 s) before the slot is free.
    per_rescue = STALE_AFTER + REAPER_EVERY + 5.0
    row = terminal(db, job_id, timeout=(limit + 1) * per_rescue + 10)
    supervisor.stop()

    assert (row["state"], row["outcome"]) == ("failed", "stale")
    assert (row["attempts"], row["rescues"]) == (limit + 1, limit)
    assert row["max_attempts"] == 10  # the rescue ceiling ended it, not the attempts
    reason = f"rescued {limit} times already: a job that kills its worker"
    assert reason in row["last_error"]
    history = events(db, job_id)
    assert [e["transition"] for e in history].count("claim") == limit + 1
    assert [e["transition"] for e in history].count("reap_requeue") == limit
    assert history[-1]["transition"] == "reap_fail"
    assert reason in history[-1]["reason"]
    # One body run per attempt: redeliveries of a killed attempt are refused by the claim.
    assert calls(broker, token) == limit + 1

    # Nothing can start a fifth attempt: no message for it exists, and the worker that
    # the job kept killing still serves other jobs.
    assert [m["attempt"] for m in outbox_rows(db, job_id)] == list(range(1, limit + 2))
    (sentinel,) = procs.enqueue({"task": "tests.echo", "kwargs": {"token": f"{token}-after"}})
    assert terminal(db, uuid.UUID(sentinel["job_id"]), timeout=15)["state"] == "succeeded"
    assert calls(broker, token) == limit + 1
    assert run_row(db, job_id)["state"] == "failed"


def test_an_outbox_row_committed_but_never_published_is_relayed_once(
    procs: Launcher, db: Engine, broker: redis.Redis
) -> None:
    beat, worker = procs.beat("beat"), procs.worker("worker")
    ready(beat, worker)
    job_id, token = uuid.uuid4(), f"crash-{uuid.uuid4().hex[:8]}"
    producer = procs.producer(
        [{"task": "tests.echo", "kwargs": {"token": token}, "job_id": job_id}],
        crash_at="after_commit_before_publish",
    )
    assert producer.wait(30) == -9  # SIGKILL, right after COMMIT
    # The journal has the job and its message; the broker never got it.
    assert run_row(db, job_id)["state"] == "queued"
    (message,) = outbox_rows(db, job_id)
    assert (message["published_at"], message["publish_count"]) == (None, 0)

    row = terminal(db, job_id, timeout=15)
    assert (row["state"], row["attempts"]) == ("succeeded", 1)
    (message,) = outbox_rows(db, job_id)
    assert message["publish_count"] == 1
    assert calls(broker, token) == 1
    assert transitions(db, job_id) == ["enqueue", "claim", "succeed"]


def test_a_producer_killed_before_its_publish_mark_is_relayed_and_runs_once(
    procs: Launcher, db: Engine, broker: redis.Redis
) -> None:
    job_id, token = uuid.uuid4(), f"unmarked-{uuid.uuid4().hex[:8]}"
    producer = procs.producer(
        [{"task": "tests.echo", "kwargs": {"token": token}, "job_id": job_id}],
        crash_at="before_publish_mark",
    )
    assert producer.wait(30) == -9  # SIGKILL in the marker thread, after the publish
    (message,) = outbox_rows(db, job_id)
    assert (message["published_at"], message["publish_count"]) == (None, 0)
    assert broker.llen("celery") == 1  # the broker has the message all the same

    beat, worker = procs.beat("beat"), procs.worker("worker")
    ready(beat, worker)
    row = terminal(db, job_id, timeout=15)
    assert (row["state"], row["attempts"]) == ("succeeded", 1)
    # The relay took the unmarked row for lost and sent it again; the copy did no work.
    eventually(lambda: outbox_rows(db, job_id)[0]["publish_count"] == 1, timeout=15)
    worker.wait_for_log(r"no work, ", timeout=15)
    assert calls(broker, token) == 1
    assert transitions(db, job_id) == ["enqueue", "claim", "succeed"]


def test_a_message_lost_by_the_broker_is_republished_after_the_unclaimed_timeout(
    procs: Launcher, db: Engine, broker: redis.Redis
) -> None:
    beat = procs.beat("beat")
    ready(beat)
    job_id, token = uuid.uuid4(), f"lost-{uuid.uuid4().hex[:8]}"
    (enqueued,) = procs.enqueue(
        {"task": "tests.echo", "kwargs": {"token": token}, "job_id": job_id}
    )
    assert enqueued["outcome"] == "enqueued"
    (message,) = outbox_rows(db, job_id)
    assert message["publish_count"] == 1  # the producer's fast path published it
    assert broker.delete("celery") == 1  # and the broker lost it
    lost_at = utcnow()

    worker = procs.worker("worker")
    ready(worker)
    # Republished one unclaimed timeout after the publish, at the relay's next tick.
    row = terminal(db, job_id, timeout=UNCLAIMED_AFTER + RELAY_EVERY + 6)
    assert (row["state"], row["attempts"]) == ("succeeded", 1)
    (message,) = outbox_rows(db, job_id)
    assert message["publish_count"] >= 2
    assert message["published_at"] > lost_at
    assert calls(broker, token) == 1
    assert transitions(db, job_id) == ["enqueue", "claim", "succeed"]


REAPED_ONE = r"reaper: \{[^}]*'jobs': 1[,}]"


@pytest.mark.serial  # the takeover's delay is asserted
def test_two_beats_one_leads_and_the_other_takes_over_when_it_dies(
    procs: Launcher, db: Engine, broker: redis.Redis
) -> None:
    leader = procs.beat("beat-a")
    leader.wait_for_log("is the leader")
    standby = procs.beat("beat-b")
    standby.wait_for_log("standing by: the lease is held by beat ")
    holder = lease_holder(db)
    assert holder is not None
    assert f":{leader.pid}:" in holder

    # Only the leader runs the passes: a stale run is reaped once, by the leader.
    (first,) = plant_stale_runs(db, 1)
    first_event(db, first, "reap_requeue", timeout=REAPER_EVERY + 10)
    leader.wait_for_log(REAPED_ONE, timeout=5)
    assert "reaper:" not in standby.log()
    assert transitions(db, first).count("reap_requeue") == 1

    leader.kill()
    killed = time.monotonic()
    new_holder = eventually(
        lambda: (h := lease_holder(db)) and f":{standby.pid}:" in h and h, timeout=LEASE + 10
    )
    took = time.monotonic() - killed
    print(f"the standby took the lease {took:.2f}s after the leader died")
    assert took <= LEASE + SLACK, f"takeover took {took:.1f}s"
    assert new_holder != holder
    standby.wait_for_log("is the leader; clearing maintenance backlog", timeout=5)

    # The passes run again, now in the new leader.
    (second,) = plant_stale_runs(db, 1)
    first_event(db, second, "reap_requeue", timeout=REAPER_EVERY + 10)
    standby.wait_for_log(REAPED_ONE, timeout=5)
    assert transitions(db, second).count("reap_requeue") == 1


def _lock_waiters(db: Engine) -> int:
    with db.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def _count(db: Engine, *where: Any) -> int:
    with db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(RUNS).where(*where)).scalar_one())


def _pass_counts(proc_log: str) -> dict[str, dict[str, int]]:
    found = [json.loads(line) for line in proc_log.splitlines() if line.startswith('{"pass"')]
    return {f["pass"]: f["counts"] for f in found}


# Stale runs, and as many unpublished jobs, that the two passes race for: ten batches of ten
# for each pass, enough to interleave; every row more is one more job for the workers after.
RACED_ROWS = 100


def test_two_maintenance_passes_at_once_touch_each_row_once(
    procs: Launcher, db: Engine, broker: redis.Redis
) -> None:
    stale = plant_stale_runs(db, RACED_ROWS)
    pending = plant_unpublished(db, RACED_ROWS)

    # A table lock is the starting gate: both processes block on their first reaper
    # query, and the commit below releases them into the same rows at the same moment.
    # The claim check is set well past the passes (so none republishes what the other
    # just published), yet inside the test, where the beat below checks it.
    small_batches = {
        "JOBSAPP_REAPER_BATCH": "10",
        "JOBSAPP_RELAY_BATCH": "10",
        "JOBSAPP_UNCLAIMED_AFTER": "10",
    }
    with db.begin() as gate:
        gate.execute(text("LOCK TABLE job_runs IN ACCESS EXCLUSIVE MODE"))
        runners = [
            procs.jobsapp(f"run-once-{i}", "maintenance", "run-once", env=small_batches)
            for i in range(2)
        ]
        eventually(lambda: _lock_waiters(db) == 2, timeout=30)
    assert [r.wait(60) for r in runners] == [0, 0]
    counts = [_pass_counts(r.log()) for r in runners]
    print("per process:", counts)
    assert sum(c["reaper"]["jobs"] for c in counts) == RACED_ROWS
    assert sum(c["relay"]["published"] for c in counts) == RACED_ROWS

    reaps = per_job(db, "reap_requeue").items()
    with db.connect() as conn:
        publish_counts = conn.execute(
            select(OUTBOX.c.publish_count, func.count()).group_by(OUTBOX.c.publish_count)
        ).all()
        states = conn.execute(
            select(RUNS.c.state, RUNS.c.attempts, RUNS.c.rescues, func.count())
            .where(RUNS.c.job_id.in_(stale))
            .group_by(RUNS.c.state, RUNS.c.attempts, RUNS.c.rescues)
        ).all()
    assert {job_id for job_id, _ in reaps} == set(stale)
    assert {n for _, n in reaps} == {1}
    # The stale runs' first messages (published before), their requeued attempts (published
    # by the reaper) and the crashed producers' rows (by the relay): once each.
    assert [tuple(r) for r in publish_counts] == [(1, 3 * RACED_ROWS)]
    assert [tuple(r) for r in states] == [("queued", 1, 1, RACED_ROWS)]
    # The broker holds one message per job: the second attempts and the first ones.
    queued = [json.loads(m)["headers"]["id"] for m in broker.lrange("celery", 0, -1)]
    assert len(queued) == len(set(queued)) == 2 * RACED_ROWS

    # Workers run everything; a beat stands by to republish a message the broker lost,
    # and the claim guard absorbs any copy it sends of one that was only slow.
    workers = [procs.worker(f"w{i}") for i in range(2)]
    ready(procs.beat("beat"), *workers)
    eventually(lambda: _count(db, RUNS.c.state == "succeeded") == 2 * RACED_ROWS, timeout=60)
    succeeded = list(per_job(db, "succeed").items())
    assert {n for _, n in succeeded} == {1}
    assert len(succeeded) == 2 * RACED_ROWS
    tokens = [f"stale-{j}" for j in stale] + [f"pending-{j}" for j in pending]
    ran = [int(v or 0) for v in broker.mget([f"jobsapp-test:calls:{t}" for t in tokens])]
    assert ran == [1] * (2 * RACED_ROWS)


@pytest.mark.serial  # the reap's delay is asserted
def test_a_beat_whose_broker_refuses_connections_still_reaps_on_time(
    procs: Launcher, db: Engine
) -> None:
    with socket.socket() as probe:  # a closed local port: every connection refused
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    unpublished = plant_unpublished(db, 500)
    beat = procs.start(
        "beat-down",
        [
            str(BIN / "celery"),
            "-A",
            "jobsapp",
            "beat",
            "-s",
            str(procs.workdir / "down-schedule"),
            "-l",
            "info",
        ],
        env={"JOBSAPP_BROKER_URL": f"redis://127.0.0.1:{closed}/0"},
    )
    ready(beat)
    (dead,) = plant_stale_runs(db, 1)
    planted = utcnow()

    reap = first_event(db, dead, "reap_requeue", timeout=30)
    delay = (reap["at"] - planted).total_seconds()
    print(f"reaped {delay:.2f}s after planting, the broker down")
    # The relay gives up on the broker at its first refusal: the reaper keeps its cadence.
    assert delay <= REAPER_EVERY + RELAY_EVERY + 3 * SLACK
    assert "standing by" not in beat.log()
    # Every message is still due for the relay once the broker is back; none backed off.
    rows = [m for job_id in unpublished for m in outbox_rows(db, job_id)]
    assert all(m["published_at"] is None and m["publish_failures"] == 0 for m in rows)


# ------------------------------------------------------------------ periodic slots

CATCH_UP = 30.0
PERIODIC = {
    "JOBSAPP_IMPORTS": "tests.support.tasks,tests.support.periodic_tasks",
    "JOBSAPP_BEAT_CATCH_UP_SECONDS": str(CATCH_UP),
}
# The per-second entry of tests/support/periodic_tasks.py (not imported here: that would
# put the entry in this process's beat schedule).
EVERY_SECOND = "tests-every-second"
SECOND = timedelta(seconds=1)


def database_now(db: Engine) -> datetime:
    with db.connect() as conn:
        return lease.database_now(conn)


def slot_runs(db: Engine) -> tuple[dict[datetime, Mapping[str, Any]], list[uuid.UUID]]:
    """The periodic task's runs by the slot their job id names, and the runs that name none."""
    with db.connect() as conn:
        found = conn.execute(select(RUNS).where(RUNS.c.task_name == "tests.periodic_tick"))
        rows = list(found.mappings())
    if not rows:
        return {}, []
    first = min(r["created_at"] for r in rows).replace(microsecond=0) - 2 * CATCH_UP * SECOND
    last = max(r["created_at"] for r in rows)
    seconds = int((last - first).total_seconds()) + 2
    slot_of = {
        periodic_slots.slot_job_id(EVERY_SECOND, due): due
        for due in (first + n * SECOND for n in range(seconds))
    }
    by_slot = {slot_of[r["job_id"]]: r for r in rows if r["job_id"] in slot_of}
    return by_slot, [r["job_id"] for r in rows if r["job_id"] not in slot_of]


def latest_slot(db: Engine) -> datetime | None:
    by_slot, _ = slot_runs(db)
    return max(by_slot, default=None)


@pytest.mark.timeout(180)
def test_two_beats_enqueue_each_slot_of_a_periodic_task_once_across_a_failover(
    procs: Launcher, db: Engine, broker: redis.Redis
) -> None:
    worker, leader = procs.worker("worker", PERIODIC), procs.beat("beat-a", PERIODIC)
    ready(worker, leader)
    leader.wait_for_log("is the leader")
    standby = procs.beat("beat-b", PERIODIC)
    standby.wait_for_log("standing by: the lease is held by beat ")
    started = database_now(db)
    eventually(lambda: (s := latest_slot(db)) and s >= started + 2 * SECOND, timeout=20)

    leader.kill()
    killed = database_now(db)
    standby.wait_for_log("is the leader", timeout=LEASE + 10)
    took_lead = database_now(db)
    eventually(lambda: (s := latest_slot(db)) and s >= took_lead + 3 * SECOND, timeout=20)
    # The standby stays up: a slot it committed but had not yet published is its relay's to send,
    # and killing the last beat here would strand it in the outbox until a beat came back.
    by_slot, strays = slot_runs(db)
    dues = sorted(by_slot)
    print(
        f"{len(dues)} slots from {dues[0]} to {dues[-1]}; killed at {killed}, "
        f"the standby led from {took_lead}"
    )
    assert strays == []
    # Every second of the observed run has its slot: none lost to the failover.
    assert dues == [dues[0] + n * SECOND for n in range(len(dues))]
    assert dues[0] <= started - (CATCH_UP - 2) * SECOND  # the first leader caught up its window
    # The slots due while nobody led were enqueued late, by the new leader.
    assert [d for d in dues if killed < d < took_lead - SECOND]
    # It offered the slots of its window again: the journal answered duplicate.
    assert re.search(rf"periodic {EVERY_SECOND}: slot \S+ -> job \S+ duplicate", standby.log())

    # Each slot's job ran its body once: a finished slot was not enqueued again either.
    for row in by_slot.values():
        assert terminal(db, row["job_id"], timeout=30)["state"] == "succeeded"
        assert transitions(db, row["job_id"]) == ["enqueue", "claim", "succeed"]
        assert calls(broker, f"tick:{row['job_id']}") == 1
