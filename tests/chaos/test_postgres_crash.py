"""Claims and heartbeats do not wait for the WAL flush; a PostgreSQL crash proves it harmless.

A durable PostgreSQL of the test's own (fsync and synchronous_commit on, as production
runs it) is SIGKILLed, postmaster and backends, right after a worker's claim committed
and before anything flushed it. The walwriter and the bgwriter are stopped first, so
nothing but a synchronous commit flushes the claim and it is lost with the crash;
docs/lifecycle.md says what follows: the finish is refused by the fence, the worker hands
the message back, and the body of that one job runs twice. When another worker claims the
same attempt again before the first one's body ends, the claim's token tells the two
claims apart: only the second is honoured.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select, text

from jobsapp.db import relaxed_autocommit
from jobsapp.lifecycle.journal.registry import JOBS
from tests.chaos.harness import (
    Cluster,
    PrivatePostgres,
    counted_tasks_env,
    log_has,
    private_postgres,
)
from tests.support.procs import ready
from tests.support.tasks import calls, open_gate

pytestmark = pytest.mark.timeout(150)

JOBS_COUNT = 8
BODY_SECONDS = 0.8
DOWN_FOR = 1.0
CLAIM_LOST = "its claim was lost in a database crash"
# A cap only: the test opens each gated body's gate itself.
GATED_SECONDS = 60.0


@pytest.fixture(scope="module")
def durable_pg() -> Iterator[PrivatePostgres]:
    # The walwriter's longest delay: an unflushed commit stays unflushed for seconds.
    with private_postgres(durable=True, settings={"wal_writer_delay": "10s"}) as server:
        yield server


def test_relaxed_commit_is_local_to_its_statement(durable_pg: PrivatePostgres) -> None:
    """The setting rides the statement's own transaction: the pooled server connection
    (shared by PgBouncer with other clients) keeps synchronous commits."""
    from sqlalchemy import create_engine

    engine = create_engine(durable_pg.url())
    with relaxed_autocommit(engine) as conn:
        assert conn.exec_driver_sql("SHOW synchronous_commit").scalar_one() == "off"
        raw = conn.connection.dbapi_connection
        assert raw is not None
        with raw.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone() == ("on",)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW synchronous_commit").scalar_one() == "on"
    engine.dispose()


def _running_and_unflushed(cluster: Cluster) -> tuple[dict[uuid.UUID, str], bool]:
    """The running runs and whether the WAL holds unflushed records, in one round trip: the
    window between a relaxed claim's commit and the next flushing commit is short (a
    heartbeat's), and two round trips under load can miss it."""
    runs = JOBS.table
    unflushed = text("pg_current_wal_flush_lsn() < pg_current_wal_insert_lsn()")
    with cluster.engine.connect() as conn:
        rows = conn.execute(
            select(runs.c.job_id, runs.c.worker, unflushed).where(runs.c.state == "running")
        ).all()
    return {row[0]: row[1] for row in rows}, any(row[2] for row in rows)


def _crash_after_a_claim(cluster: Cluster, pg: PrivatePostgres) -> tuple[uuid.UUID, str]:
    """Crash the database as soon as a fresh claim is committed and not yet flushed;
    the claimed job and the worker that claimed it."""
    seen: set[uuid.UUID] = set()
    pg.hold_wal_flushes()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running, unflushed = _running_and_unflushed(cluster)
        fresh = {job_id: worker for job_id, worker in running.items() if job_id not in seen}
        if fresh and unflushed:
            pg.crash()
            return next(iter(fresh.items()))
        seen |= set(fresh)
        time.sleep(0.002)
    # Let the held processes go (SIGKILL reaches a stopped process; the fixture's SIGQUIT
    # would not) and leave the module's server running.
    pg.crash()
    pg.start()
    raise AssertionError("no claim was ever left unflushed: claims wait for the WAL flush")


@pytest.mark.serial  # Postgres must crash inside a claim's unflushed window, milliseconds wide
def test_claim_lost_in_a_postgres_crash(
    durable_cluster: Cluster, durable_pg: PrivatePostgres
) -> None:
    cluster = durable_cluster
    tokens = {f"crash-{uuid.uuid4()}": None for _ in range(JOBS_COUNT)}
    handles = cluster.launcher.enqueue(
        *(
            {"task": "tests.keyed", "kwargs": {"account": t, "token": t, "seconds": BODY_SECONDS}}
            for t in tokens
        )
    )
    jobs = {uuid.UUID(h["job_id"]): t for h, t in zip(handles, tokens, strict=True)}
    worker = cluster.worker("w1", env=counted_tasks_env())
    ready(worker, timeout=60)

    crashed, _ = _crash_after_a_claim(cluster, durable_pg)
    time.sleep(DOWN_FOR)
    durable_pg.start()
    beat = cluster.beat()
    ready(beat, timeout=60)

    runs = JOBS.table
    cluster.wait_for(
        lambda: all(
            r["state"] == "succeeded"
            for r in cluster._rows(select(runs.c.state).where(runs.c.job_id.in_(jobs)))
        ),
        "every job succeeded",
        90,
    )
    assert log_has(worker, CLAIM_LOST), "the worker did not hand back the lost claim's message"
    for job_id, token in jobs.items():
        succeeded = [t for t, _ in cluster.transitions(job_id) if t == "succeed"]
        assert succeeded == ["succeed"], (job_id, cluster.transitions(job_id))
        # The body is at-least-once: the crashed claim's body ran before and after it.
        assert calls(token) == (2 if job_id == crashed else 1), (job_id, calls(token))
    assert cluster.count(runs) == JOBS_COUNT
    assert not cluster._rows(select(runs.c.job_id).where(runs.c.state == "running"))


# The same window, and one job: one chance to crash inside it.
@pytest.mark.serial
def test_a_lost_claim_is_never_taken_for_a_later_claim_of_its_attempt(
    durable_cluster: Cluster, durable_pg: PrivatePostgres
) -> None:
    """The first worker claims attempt 1 of a keyed job; the crash loses the claim, and
    after the restart (beat starts then: its lease commits, every tick, would flush the
    claim) the relay republishes it and the second worker claims attempt 1 again while
    the first body still runs. The first body ends first, so its finish comes after the
    second claim: both claims carry the same attempt number, only their tokens differ."""
    cluster = durable_cluster
    token = f"fence-{uuid.uuid4()}"
    workers = {name: cluster.worker(name, env=counted_tasks_env()) for name in ("w1", "w2")}
    ready(*workers.values(), timeout=60)
    (handle,) = cluster.launcher.enqueue(
        {"task": "tests.gated", "kwargs": {"token": token, "seconds": GATED_SECONDS}}
    )
    job_id = uuid.UUID(handle["job_id"])

    crashed, claimer = _crash_after_a_claim(cluster, durable_pg)
    assert crashed == job_id
    first = workers[claimer.split("@", 1)[0]]
    second = next(proc for proc in workers.values() if proc is not first)
    time.sleep(DOWN_FOR)
    durable_pg.start()
    runs = JOBS.table

    def run() -> dict[str, Any]:
        return cluster._rows(select(runs).where(runs.c.job_id == job_id))[0]

    # Nothing moves the run before beat's relay republishes it: the crash must have lost
    # the claim, or the scenario below would be a surviving claim's (reaped as attempt 2).
    assert run()["state"] == "queued", run()
    ready(cluster.beat(), timeout=60)

    def claimed_again() -> dict[str, Any] | None:
        row = run()
        mine = row["state"] == "running" and row["worker"].startswith(f"{second.name}@")
        return row if mine else None

    again = cluster.wait_for(claimed_again, "the second worker claimed the job", 60)
    assert again["attempts"] == 1
    open_gate(token, 1)
    cluster.wait_for(
        lambda: (
            log_has(first, rf"job {job_id} attempt 1: finish refused")
            or run()["state"] == "succeeded"
        ),
        "the first worker's finish",
        30,
    )
    open_gate(token, 2)
    # The second worker's finish: the run succeeded (its Celery result is the body's value,
    # which names no attempt), or its lease was lost.
    cluster.wait_for(
        lambda: (
            run()["state"] == "succeeded" or log_has(second, rf"job {job_id} attempt 1: lease lost")
        ),
        "the second worker's finish",
        30,
    )

    finishes = [e["actor"] for e in cluster.events(job_id) if e["transition"] == "succeed"]
    assert finishes == [again["worker"]], cluster.transitions(job_id)
    done = run()
    assert (done["state"], done["attempts"], done["worker"]) == ("succeeded", 1, again["worker"])
    # The first worker: told at a beat, as a lost lease is; its finish refused; the loss named.
    assert log_has(first, rf"(?m)job {job_id} attempt 1: lease lost$"), first.log()[-3000:]
    assert log_has(first, rf"job {job_id} attempt 1: finish refused")
    # Named after the refused finish, once an outcome write that met a connection the crash
    # closed has been retried.
    cluster.wait_for(lambda: log_has(first, CLAIM_LOST), "the first worker names the loss", 30)
    assert not log_has(second, "finish refused")
    # Bodies are at-least-once (both ran); only the first was told its lease was lost.
    assert (calls(token), calls(f"{token}:told")) == (2, 1)
