"""Priorities end to end: Celery's ``priority`` decides the relay's order and the broker's.

A real ``celery -A jobsapp worker -c 1`` on Redis and on RabbitMQ, held busy by a gate
job while low and then high priority jobs are enqueued: once the gate opens, the high
ones run first. The run row keeps the priority, so a retry's message carries it too, and
the relay publishes the most urgent due rows first.
"""

from __future__ import annotations

import os
import shlex
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine, update

from jobsapp.celery_app import app, create_app
from jobsapp.lifecycle import journal, outbox_queries
from jobsapp.lifecycle.enqueue import transaction
from jobsapp.lifecycle.journal import OUTBOX, NewJob
from jobsapp.settings import get_settings
from tests.e2e.procs import BIN, WORKER_FLAGS, launching, ready
from tests.support import priority_tasks, tasks
from tests.support.env import service
from tests.support.journal_view import outbox_rows, run_row
from tests.support.migrations import sqlite_then_postgres
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(180)

LOW, HIGH = 1, 8
ROOT = Path(__file__).resolve().parents[2]


# A deployment's settings (its celeryconfig.py over jobsapp's): RabbitMQ orders a queue
# only if it was declared with x-max-priority (Redis ignores the argument).
DEPLOYMENT = "task_queue_max_priority = 9\n"


@dataclass(frozen=True)
class Broker:
    producer: Celery  # jobsapp's app on this broker, publishing to ``queue``
    queue: str


@pytest.fixture(params=["redis", "amqp"])
def broker(
    request: pytest.FixtureRequest, pg: Engine, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Broker]:
    """jobsapp's app on the broker, with a queue of its own (deleted afterwards)."""
    name = "JOBSAPP_TEST_REDIS_URL" if request.param == "redis" else "JOBSAPP_TEST_AMQP_URL"
    monkeypatch.setenv("JOBSAPP_BROKER_URL", service(name))
    get_settings.cache_clear()
    queue = f"priorities-{uuid.uuid4().hex}"
    producer = create_app()
    producer.conf.update(task_default_queue=queue, task_queue_max_priority=9)
    yield Broker(producer, queue)
    with producer.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)
    producer.close()
    monkeypatch.undo()
    get_settings.cache_clear()


def _job(task: object, priority: int | None = None, **kwargs: object) -> NewJob:
    job: NewJob = task.new_job((), kwargs, None)  # type: ignore[attr-defined]
    return replace(job, priority=priority)


def _enqueue(app: Celery, *jobs: NewJob) -> None:
    with transaction(app) as batch:
        for job in jobs:
            batch.add(job)


def test_high_priority_jobs_waiting_behind_a_busy_worker_run_before_low_ones(
    broker: Broker, tmp_path: Path
) -> None:
    token = uuid.uuid4().hex[:8]
    env = {**os.environ, "JOBSAPP_IMPORTS": "tests.support.priority_tasks",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    deployment = tmp_path / "deployment"
    deployment.mkdir()
    (deployment / "celeryconfig.py").write_text(DEPLOYMENT)
    celery = shlex.join([str(BIN / "celery"), "-A", "jobsapp", "worker", *WORKER_FLAGS,
                         "-Q", broker.queue, "-n", f"priorities-{token}@%h"])  # fmt: skip
    with launching(env, tmp_path) as launcher:
        # Started from the deployment's folder, where jobsapp finds its celeryconfig.py.
        worker = launcher.start("worker", ["sh", "-c", f"cd {deployment} && exec {celery}"])
        ready(worker, timeout=60)
        _enqueue(broker.producer, _job(priority_tasks.gate, token=token))
        gate = priority_tasks.key(token, "gate")
        eventually(lambda: tasks.counter().get(gate) == b"held", timeout=60)
        # The worker's one slot is taken: everything below waits in the broker's queue.
        lows = [f"low{i}" for i in range(4)]
        highs = [f"high{i}" for i in range(4)]
        _enqueue(broker.producer, *(_job(priority_tasks.ordered, LOW, token=token, label=label)
                                    for label in lows))  # fmt: skip
        _enqueue(broker.producer, *(_job(priority_tasks.ordered, HIGH, token=token, label=label)
                                    for label in highs))  # fmt: skip
        tasks.counter().set(gate, "open")
        order = priority_tasks.key(token, "order")
        eventually(lambda: tasks.counter().llen(order) == 8, timeout=60)
    assert [label.decode() for label in tasks.counter().lrange(order, 0, -1)] == highs + lows


def test_a_retry_keeps_the_jobs_priority(worker: object, db: Engine) -> None:
    token = uuid.uuid4().hex[:8]
    job = _job(tasks.flaky, 7, token=token, fail_times=1, secret="s")
    _enqueue(tasks.flaky.app, job)
    eventually(lambda: run_row(db, job.job_id)["state"] == "succeeded", timeout=30)
    assert run_row(db, job.job_id)["priority"] == 7
    assert [row["priority"] for row in outbox_rows(db, job.job_id)] == [7, 7]


def test_the_relay_publishes_the_most_urgent_due_rows_first(db: Engine) -> None:
    jobs = [_job(tasks.echo, priority, token=f"t{i}")
            for i, priority in enumerate((None, 3, 9, 3, None))]  # fmt: skip
    with db.begin() as conn:
        now = journal.clock(conn, None)
        for job in jobs:
            journal.enqueue(conn, job, actor="test")
        # Due in the order written (older first), a second apart.
        for age, job in enumerate(reversed(jobs)):
            conn.execute(update(OUTBOX).where(OUTBOX.c.job_id == job.job_id).values(
                available_at=now - timedelta(seconds=60 + age)))  # fmt: skip
    with db.begin() as conn:
        due = outbox_queries.due_messages(conn, now=now, limit=10,
                                           default_queue=app.conf.task_default_queue)
    assert [m.job_id for m in due] == [jobs[i].job_id for i in (2, 1, 3, 0, 4)]
    assert [m.priority for m in due] == [9, 3, 3, 0, 0]


def test_migration_0018_goes_down_and_up_again(tmp_path: Path) -> None:
    sqlite_then_postgres(tmp_path, "priority", "priority", below="0017")
