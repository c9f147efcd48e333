"""The cost of a key limit and of fairness per job: enqueue, claim and finish through the
journal, one job at a time on one connection, on the fsync-on cluster, beside none.

``limits`` line, three series of the same jobs: no limit (the producer's and the worker's
one-statement autocommit writes); ``limit=3`` with a free slot at each enqueue (the key's
line joined, the slot taken, and freed by the finish: the check every limited job pays);
``limit=3`` with every job enqueued first on one key, so all but three wait parked and each
finish grants the next (the line at work).

``fairness`` line: every job enqueued first, then run in arrival order, plain (no key
limit) beside ``fair=True`` on one key (all but the window of 2 wait parked; each claim's
own transaction lets the next one be granted: the round-robin claim). The broker is left
out: its cost is the same in every series.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from celery import Celery
from sqlalchemy import Engine

from bench.bench_maintenance import drop_database, fresh_database
from bench.services import Services
from jobsapp.db import autocommit, relaxed_autocommit
from jobsapp.lifecycle import journal, lifecycle_task
from jobsapp.lifecycle.journal import NewJob
from jobsapp.lifecycle.task import LifecycleTask
from jobsapp.lifecycle.worker import key_limits

DB_NAME = "jobsapp_bench_limits"
SIZES = {"smoke": (30, 1), "quick": (300, 3), "full": (1000, 5)}
LIMIT = 3

_app = Celery("bench-limits", set_as_current=False)


@lifecycle_task(_app, name="bench.unlimited", key="{tenant}-{n}")
def unlimited(tenant: str, n: int) -> None:
    del tenant, n


@lifecycle_task(_app, name="bench.limited", key="{tenant}", limit=LIMIT)
def limited(tenant: str, n: int) -> None:
    del tenant, n


@lifecycle_task(_app, name="bench.fair", key="{tenant}", fair=True)
def fair(tenant: str, n: int) -> None:
    del tenant, n


def _new_job(task: LifecycleTask, tenant: str, n: int) -> NewJob:
    return task.new_job((tenant, n), {}, uuid.uuid4())


def enqueue(engine: Engine, job: NewJob) -> None:
    """As lifecycle/producer/enqueue.py's own transaction writes it (the broker left out)."""
    if job.key_limit is None:
        with autocommit(engine) as conn:
            journal.enqueue_new(conn, job, actor="bench")
        return
    with engine.begin() as conn:
        journal.enqueue(conn, job, actor="bench")


def run(engine: Engine, job: NewJob) -> None:
    """Claim and succeed, as a worker writes them."""
    with relaxed_autocommit(engine) as conn:
        row = journal.claim(conn, job.spec, job.job_id, 1, worker="bench")
    assert row is not None, "a job under its limit must be claimable"
    if job.task_name == fair.name:
        key_limits.fair_claimed(engine, job.spec, row)
    limited = row.key_limit is not None  # as worker/attempt.py writes an outcome
    with engine.begin() if limited else autocommit(engine) as conn:
        done = journal.succeed(
            conn, job.spec, job.job_id, 1, token=row.claimed_token, actor="bench"
        )
        key_limits.let_go(conn, job.spec, row, done)


def one_by_one(engine: Engine, jobs: list[NewJob]) -> None:
    for job in jobs:
        enqueue(engine, job)
        run(engine, job)


def in_line(engine: Engine, jobs: list[NewJob]) -> None:
    """All enqueued first (on one key: all but ``LIMIT`` wait), then run in arrival order."""
    for job in jobs:
        enqueue(engine, job)
    for job in jobs:
        run(engine, job)


Series = Callable[[Engine, list[NewJob]], None]
# Per line: its series, the first one the base the second one's check is set against.
LINES: dict[str, dict[str, tuple[LifecycleTask, Series]]] = {
    "limits": {
        "no limit": (unlimited, one_by_one),
        f"limit={LIMIT}, slot free": (limited, one_by_one),
        f"limit={LIMIT}, waiting in line": (limited, in_line),
    },
    "fairness": {
        "plain": (unlimited, in_line),
        "fair, one key's backlog": (fair, in_line),
    },
}
SERIES = {name: way for series in LINES.values() for name, way in series.items()}
WHAT = {"limits": "a limit check", "fairness": "a round-robin claim"}


def ms_per_job(engine: Engine, name: str, n: int) -> float:
    task, series = SERIES[name]
    tenant = uuid.uuid4().hex[:8]
    jobs = [_new_job(task, tenant, i) for i in range(n)]
    started = time.perf_counter()
    series(engine, jobs)
    return (time.perf_counter() - started) * 1000 / n


def main(services: Services, size: str, out: Path) -> list[str]:
    del out
    n, rounds = SIZES[size]
    pg_base = services.durable.pg_url("postgres").rsplit("/", 1)[0]
    engine = fresh_database(pg_base, DB_NAME)
    samples: dict[str, list[float]] = {name: [] for name in SERIES}
    try:
        for _ in range(rounds):
            for name, taken in samples.items():  # interleaved: a drift of the machine hits all
                taken.append(ms_per_job(engine, name, n))
    finally:
        engine.dispose()
        drop_database(pg_base, DB_NAME)
    results = {name: statistics.median(taken) for name, taken in samples.items()}
    return [
        ratio_line(line, {name: results[name] for name in LINES[line]}, rounds) for line in LINES
    ]


def ratio_line(line: str, results: dict[str, float], rounds: int) -> str:
    """``results``' first series is the base, its second the check the line is about."""
    base, checked = list(results.values())[:2]
    figures = ", ".join(f"{name} {ms:.2f}" for name, ms in results.items())
    return (
        f"{line}: enqueue+claim+finish ms/job (fsync on, medians of {rounds}): {figures}; "
        f"{WHAT[line]} costs {checked - base:+.2f} ms/job ({checked / base:.2f}x)"
    )
