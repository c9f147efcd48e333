"""What flow control costs: a rate check per claim, and priorities per enqueue and relay
publish, each beside none, Postgres fsync on.

Run through the entry point, on the bench's own Postgres with fsync on:
    .venv/bin/python -m bench flow [--quick | --smoke]
(full: 2,000 jobs a round, median of 5 rounds; quick: 1,000, median of 3; smoke: 200, once).

Each round queues its jobs in a fresh database, then claims every one from one process
through the claim path a worker takes (``gating.gated_claim`` around the journal's claim),
three ways: no flow control (the claim's one statement, its commit not waiting for the
flush); a task with no rate while nothing is paused (the same statement after a cached
look at the pauses); a task with a rate high enough never to refuse (the claim, the pause
check and the rate's token in one transaction, whose commit waits for the flush). The
body and the finish are left out: they cost the same either way.

The priorities line enqueues the same number of jobs one by one (the producer's
one-statement enqueue), then has the relay publish them all to Redis, without a priority
and with priorities 0 to 9 in turn (the row's and the outbox row's ``priority``, the due
rows taken most urgent first, the message's priority on the broker).
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import redis
from celery import Celery
from sqlalchemy import Engine

from bench.bench_maintenance import drop_database, fresh_database
from bench.services import Services
from jobsapp.db import autocommit
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.flow import gating
from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.lifecycle.task import LifecycleTask
from jobsapp.lifecycle.worker import claim
from jobsapp.maintenance import relay

DB_NAME = "jobsapp_bench_flow"
SIZES = {"full": (2000, 5), "quick": (1000, 3), "smoke": (200, 1)}
NEVER_REFUSES = gating.parse_rate("1000000/s")
Gate = gating.Gate | None
BROKER_DB = 8
# Every row due at once: none is left to a producer's fast path.
RELAY = relay.RelayConfig(grace=timedelta(0))


def _queued(engine: Engine, task: LifecycleTask, n: int) -> list[uuid.UUID]:
    jobs = [task.new_job((), {}, None) for _ in range(n)]
    with engine.begin() as conn:
        journal.enqueue_many(conn, jobs, actor="bench")
        # Statistics as a production table has them after autovacuum's first pass, so
        # the series do not depend on when autovacuum happens to run mid-bench.
        conn.exec_driver_sql(f"ANALYZE {JOBS.table.name}")
    return [job.job_id for job in jobs]


def _claim_of(job_id: uuid.UUID) -> gating.Claim:
    return lambda conn: journal.claim(conn, JOBS, job_id, 1, worker="bench")


def per_job_ms(engine: Engine, task: LifecycleTask, gate: Gate, n: int) -> float:
    """Milliseconds per claim of ``n`` queued jobs through ``gate``."""
    ids = _queued(engine, task, n)
    began = time.perf_counter()
    for job_id in ids:
        row = claim.taken(engine, JOBS, gate, _claim_of(job_id))
        if row is None or isinstance(row, gating.Held):
            raise RuntimeError(f"the claim of {job_id} was refused: nothing to measure")
    return (time.perf_counter() - began) / n * 1000


def relayed_ms(
    engine: Engine, app: Celery, task: LifecycleTask, prioritised: bool, n: int
) -> float:
    """Milliseconds per job to enqueue ``n`` jobs and have the relay publish them."""
    while relay.run_once(app, engine, RELAY)["published"]:
        pass  # untimed: the claim series leave their rows unpublished
    jobs = [task.new_job((), {}, None) for _ in range(n)]
    if prioritised:
        jobs = [replace(job, priority=i % 10) for i, job in enumerate(jobs)]
    began = time.perf_counter()
    for job in jobs:
        with autocommit(engine) as conn:
            journal.enqueue_new(conn, job, actor="bench")
    published = 0
    while published < n:
        passed = relay.run_once(app, engine, RELAY)["published"]
        if not passed:
            raise RuntimeError(f"the relay published {published} of {n}: is Redis up?")
        published += passed
    return (time.perf_counter() - began) / n * 1000


def main(services: Services, size: str, out: Path) -> list[str]:
    """Returns the ratio lines: a claim with a rate check, and a prioritised enqueue and
    publish, each against none."""
    del out
    from bench.lifecycle_tasks import with_lifecycle

    n, rounds = SIZES[size]
    pg_base = services.durable.pg_url("postgres").rsplit("/", 1)[0]
    engine = fresh_database(pg_base, DB_NAME)
    broker_url = services.durable.redis_url(BROKER_DB)
    broker = redis.Redis.from_url(broker_url)
    app = Celery("bench-flow", broker=broker_url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"])
    ways: dict[str, Gate] = {
        "none": None,
        "idle": gating.Gate(with_lifecycle.name, "celery", holds=(gating.while_paused,)),
        "rate": gating.Gate(with_lifecycle.name, "celery", NEVER_REFUSES),
    }
    samples: dict[str, list[float]] = {way: [] for way in [*ways, "plain", "prioritised"]}
    for number in range(rounds):
        for way, gate in ways.items():  # interleaved: a drift of the machine hits all
            samples[way].append(per_job_ms(engine, with_lifecycle, gate, n))
        for way in ("plain", "prioritised"):
            samples[way].append(relayed_ms(engine, app, with_lifecycle, way != "plain", n))
            broker.flushdb()
        print(
            f"round {number}: " + ", ".join(f"{w} {s[-1]:.3f} ms" for w, s in samples.items()),
            flush=True,
        )
    broker.flushdb()
    app.close()
    engine.dispose()
    drop_database(pg_base, DB_NAME)
    none, idle, rate, plain, urgent = (statistics.median(s) for s in samples.values())
    return [
        f"flow: a claim with a rate check {rate:.3f} ms/job vs {none:.3f} ms/job with no "
        f"limit ({rate / none:.2f}x; fsync on); flow control on, nothing paused: "
        f"{idle:.3f} ms/job ({idle / none:.2f}x)",
        f"priorities: enqueue+relay publish ms/job (fsync on, medians of {rounds}): no "
        f"priority {plain:.3f}, priorities 0-9 {urgent:.3f}; a priority costs "
        f"{urgent - plain:+.3f} ms/job ({urgent / plain:.2f}x)",
    ]
