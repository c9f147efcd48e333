"""Priorities end to end: ``priority`` means what it means to a plain Celery app on the broker.

The same backlog of mixed priorities, sent while no worker consumes, is drained by one
worker (``-c 1``, prefetch 1) of a plain Celery app and by one of jobsapp, on Redis and on
RabbitMQ: both run it in the same order, the broker's (Redis: 0 first; RabbitMQ with
x-max-priority: 9 first; none is 0 on both). A backlog the relay publishes comes out in
that order too, the relay's due rows are taken in it, and a retry keeps the priority.
"""

from __future__ import annotations

import os
import shlex
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine, inspect, update

from jobsapp.celery_app import app, create_app
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.flow import priorities
from jobsapp.lifecycle.journal import OUTBOX, NewJob, outbox_queries
from jobsapp.lifecycle.producer.enqueue import transaction
from jobsapp.lifecycle.transport import publisher
from jobsapp.maintenance import relay
from jobsapp.settings import get_settings
from tests.support import bare_celery, priority_tasks, tasks
from tests.support.env import service
from tests.support.journal_view import outbox_rows, run_row
from tests.support.migrations import sqlite_then_postgres
from tests.support.procs import BIN, WORKER_FLAGS, Launcher, Proc, launching, ready
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
# (label, priority) in the order sent; None: no priority given.
BACKLOG = (("a", 5), ("b", None), ("c", 9), ("d", 0), ("e", 5), ("f", 3), ("g", 9), ("h", None))
# The order each broker serves it: Redis 0 (and none) first, RabbitMQ 9 first, and within
# a priority the order sent.
SERVED = {"redis": list("bdhfaecg"), "amqp": list("cgaefbdh")}
FLAGS = (*WORKER_FLAGS, "--prefetch-multiplier", "1")

# A deployment's settings (its celeryconfig.py over jobsapp's): RabbitMQ orders a queue
# only if it was declared with x-max-priority (Redis ignores the argument).
DEPLOYMENT = "task_queue_max_priority = 9\n"


@dataclass(frozen=True)
class Broker:
    kind: str  # "redis" or "amqp"
    url: str
    producer: Celery  # jobsapp's app on this broker, publishing to ``queue``
    queue: str


@pytest.fixture(params=["redis", "amqp"])
def broker(
    request: pytest.FixtureRequest, pg: Engine, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Broker]:
    """jobsapp's app on the broker, with a queue of its own (deleted afterwards)."""
    name = "JOBSAPP_TEST_REDIS_URL" if request.param == "redis" else "JOBSAPP_TEST_AMQP_URL"
    url = service(name)
    monkeypatch.setenv("JOBSAPP_BROKER_URL", url)
    get_settings.cache_clear()
    queue = f"priorities-{uuid.uuid4().hex}"
    producer = create_app()
    producer.conf.update(task_default_queue=queue, task_queue_max_priority=9)
    yield Broker(request.param, url, producer, queue)
    _delete_queue(producer, queue)
    producer.close()
    monkeypatch.undo()
    get_settings.cache_clear()


def _delete_queue(owner: Celery, queue: str) -> None:
    with owner.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)


def _job(task: object, priority: int | None = None, **kwargs: object) -> NewJob:
    job: NewJob = task.new_job((), kwargs, None)  # type: ignore[attr-defined]
    return replace(job, priority=priority)


def _enqueue(app: Celery, *jobs: NewJob) -> None:
    with transaction(app) as batch:
        for job in jobs:
            batch.add(job)


def _backlog(token: str) -> list[NewJob]:
    return [_job(priority_tasks.ordered, p, token=token, label=label) for label, p in BACKLOG]


def _jobsapp_worker(launcher: Launcher, broker: Broker, tmp_path: Path) -> Proc:
    """``celery -A jobsapp worker -c 1`` on the queue, started from a deployment's folder
    (where jobsapp finds its celeryconfig.py)."""
    deployment = tmp_path / "deployment"
    deployment.mkdir(exist_ok=True)
    (deployment / "celeryconfig.py").write_text(DEPLOYMENT)
    name = f"jobsapp-{uuid.uuid4().hex[:8]}@%h"
    celery = shlex.join(
        [str(BIN / "celery"), "-A", "jobsapp", "worker", *FLAGS, "-Q", broker.queue, "-n", name]
    )
    return launcher.start("jobsapp", ["sh", "-c", f"cd {deployment} && exec {celery}"])


def _bare_worker(launcher: Launcher, broker: Broker, queue: str) -> Proc:
    argv = [
        str(BIN / "celery"),
        "-A",
        "tests.support.bare_celery",
        "worker",
        *FLAGS,
        "-Q",
        queue,
        "-n",
        f"bare-{uuid.uuid4().hex[:8]}@%h",
    ]
    return launcher.start(
        "bare", argv, {bare_celery.BROKER_URL: broker.url, bare_celery.QUEUE: queue}
    )


def _waiting(owner: Celery, queue: str, count: int) -> bool:
    return publisher.queue_depths(owner, [queue])[queue] == count


def _ran(order: str, count: int) -> list[str]:
    """The labels in the order their bodies ran (recorded in the list ``order``), once
    ``count`` have."""
    eventually(lambda: tasks.counter().llen(order) == count, timeout=90)
    return [label.decode() for label in tasks.counter().lrange(order, 0, -1)]


@pytest.fixture
def launcher(broker: Broker, tmp_path: Path) -> Iterator[Launcher]:
    """Worker processes on the broker's URL (set by ``broker``) and this session's journal."""
    env = {**os.environ, "JOBSAPP_IMPORTS": "tests.support.priority_tasks", "PYTHONPATH": str(ROOT)}
    with launching(env, tmp_path) as started:
        yield started


def test_a_backlog_runs_in_the_same_order_as_in_plain_celery(
    broker: Broker, launcher: Launcher, tmp_path: Path
) -> None:
    bare_token, jobsapp_token = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    bare_queue = f"{broker.queue}-bare"
    bare = bare_celery.make_app(broker.url, bare_queue)
    ordered = bare.tasks["tests.bare.ordered"]
    try:
        for label, priority in BACKLOG:  # as a Celery user writes it
            ordered.apply_async((bare_token, label), priority=priority)
        _enqueue(broker.producer, *_backlog(jobsapp_token))
        # Both backlogs wait in the broker before any worker consumes.
        eventually(lambda: _waiting(bare, bare_queue, len(BACKLOG)))
        eventually(lambda: _waiting(broker.producer, broker.queue, len(BACKLOG)))
        ready(
            _bare_worker(launcher, broker, bare_queue),
            _jobsapp_worker(launcher, broker, tmp_path),
            timeout=90,
        )
        plain_celery = _ran(bare_celery.order_key(bare_token), len(BACKLOG))
        jobsapp = _ran(priority_tasks.key(jobsapp_token, "order"), len(BACKLOG))
        assert jobsapp == plain_celery == SERVED[broker.kind]
    finally:
        _delete_queue(bare, bare_queue)
        bare.close()


def test_a_backlog_the_relay_publishes_runs_in_the_brokers_order(
    broker: Broker, launcher: Launcher, pg: Engine, tmp_path: Path
) -> None:
    """Publishes held back (the rows written, nothing sent), then one relay tick sends the
    backlog to an idle worker: the first message it gets is the broker's most urgent."""
    ready(_jobsapp_worker(launcher, broker, tmp_path), timeout=90)
    token = uuid.uuid4().hex[:8]
    with pg.begin() as conn:
        for job in _backlog(token):
            journal.enqueue(conn, job, actor="test")
    counts = relay.run_once(broker.producer, pg, relay.RelayConfig(grace=timedelta(0)))
    assert counts["published"] == len(BACKLOG)
    assert _ran(priority_tasks.key(token, "order"), len(BACKLOG)) == SERVED[broker.kind]


def test_a_retry_keeps_the_jobs_priority(worker: object, db: Engine) -> None:
    token = uuid.uuid4().hex[:8]
    job = _job(tasks.flaky, 7, token=token, fail_times=1, secret="s")
    _enqueue(tasks.flaky.app, job)
    eventually(lambda: run_row(db, job.job_id)["state"] == "succeeded", timeout=30)
    assert run_row(db, job.job_id)["priority"] == 7
    assert [row["priority"] for row in outbox_rows(db, job.job_id)] == [7, 7]


@pytest.mark.parametrize(
    ("broker_url", "order"),
    [
        ("redis://localhost", [0, 4, 1, 3, 2]),
        ("amqp://localhost", [2, 1, 3, 0, 4]),
    ],
)
def test_the_relay_takes_due_rows_in_the_order_the_broker_serves(
    db: Engine, broker_url: str, order: Sequence[int]
) -> None:
    """Redis serves 0 (and none) first, RabbitMQ 9 first; each priority longest due first."""
    jobs = [
        _job(tasks.echo, priority, token=f"t{i}")
        for i, priority in enumerate((None, 3, 9, 3, None))
    ]
    with db.begin() as conn:
        now = journal.clock(conn, None)
        for job in jobs:
            journal.enqueue(conn, job, actor="test")
        # Due in the order written (older first), a second apart.
        for age, job in enumerate(reversed(jobs)):
            conn.execute(
                update(OUTBOX)
                .where(OUTBOX.c.job_id == job.job_id)
                .values(available_at=now - timedelta(seconds=60 + age))
            )
    on_broker = Celery("on-broker", broker=broker_url)
    with db.begin() as conn:
        due = outbox_queries.due_messages(
            conn,
            now=now,
            limit=10,
            default_queue=app.conf.task_default_queue,
            lowest_first=priorities.lowest_first(on_broker),
        )
    assert [m.job_id for m in due] == [jobs[i].job_id for i in order]


def test_the_relay_reads_due_rows_through_the_level_index(pg: Engine) -> None:
    names = {index["name"] for index in inspect(pg).get_indexes("outbox")}
    assert "ix_outbox_pending_level" in names
    assert "ix_outbox_pending_priority" not in names


def test_migration_0018_goes_down_and_up_again(tmp_path: Path) -> None:
    sqlite_then_postgres(tmp_path, "priority", "priority", below="0017")
