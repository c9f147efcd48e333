"""A real prefork worker's own task events (lifecycle/worker/held_events.py), as Flower's
event receiver hears them: every job's received, started and succeeded arrive, in
``task.multi`` messages of many events rather than a message each, the user's call only
in the task-started, and the events the worker holds when it is stopped, or a pool child
when it is replaced, are sent before it exits."""

from __future__ import annotations

import signal
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine

from jobsapp.lifecycle.rules.message import task_id_for
from tests.support.env import SESSION
from tests.support.event_watch import Watch, watching
from tests.support.journal_view import run_row
from tests.support.procs import Launcher, launching, ready, service_env
from tests.support.servers import RedisServer
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(180)

JOBS = 40
PARENT_EVENTS = ("task-received", "task-succeeded")


@dataclass
class Watched:
    launcher: Launcher
    watch: Watch
    name: str  # the worker's ``-n``
    host: str  # its hostname in the events


@contextmanager
def _watched(name: str, postgres_url: str, redis: RedisServer, tmp_path: Path) -> Iterator[Watched]:
    """A launcher of processes on ``redis``, and a watcher of their events subscribed."""
    env = service_env(
        database_url=postgres_url, broker_url=redis.url, var_dir=tmp_path / "var", settings={}
    )
    watcher = Celery("watcher", broker=redis.url, set_as_current=False)
    with launching(env, tmp_path) as launcher, watching(watcher, f"probe-{SESSION}@here") as watch:
        yield Watched(launcher, watch, name, f"{name}@{socket.gethostname()}")


def _events_of(watch: Watch, host: str, kind: str) -> dict[str, dict[str, object]]:
    return {str(e["uuid"]): e for _, batch in watch.of(host) for e in batch if e["type"] == kind}


def test_a_workers_task_events_arrive_together_and_every_one_arrives(
    pg: Engine, postgres_url: str, module_redis: RedisServer, tmp_path: Path
) -> None:
    with _watched(f"events-{SESSION}", postgres_url, module_redis, tmp_path) as w:
        token = uuid.uuid4().hex[:8]
        jobs = w.launcher.enqueue(
            *({"task": "tests.echo", "kwargs": {"token": f"{token}-{i}"}} for i in range(JOBS))
        )
        ready(w.launcher.worker(w.name), timeout=60)
        w.watch.until(w.host, 3 * JOBS, timeout=60)
    watch, host = w.watch, w.host

    ids = {task_id_for(uuid.UUID(job["job_id"]), 1) for job in jobs}
    for kind in ("task-received", "task-started", "task-succeeded"):
        assert set(_events_of(watch, host, kind)) == ids, kind
    # The call is the task-started's (the user's): a task-received heard after it, which
    # Flower would let override it, carries none.
    assert not [e for e in _events_of(watch, host, "task-received").values() if "args" in e]
    started = _events_of(watch, host, "task-started").values()
    # (scrubbed as every call Flower shows is: a parameter named ``token`` reads as a secret)
    assert {(e["args"], e["kwargs"]) for e in started} == {("()", "{'token': '***'}")}
    # The worker's own (its consumer's) events: Celery publishes each on its own when no
    # other is held at the event loop's next turn, here 24 to a message at most.
    parent = [
        (key, events)
        for key, batch in watch.of(host)
        if (events := [e for e in batch if e["type"] in PARENT_EVENTS])
    ]
    assert {key for key, _ in parent} == {"task.multi"}
    assert len(parent) <= len(PARENT_EVENTS) * JOBS // 4, [len(e) for _, e in parent]


def test_a_worker_stopped_during_a_job_sends_its_events_before_it_exits(
    pg: Engine, postgres_url: str, module_redis: RedisServer, tmp_path: Path
) -> None:
    with _watched(f"stopped-{SESSION}", postgres_url, module_redis, tmp_path) as w:
        worker = w.launcher.worker(w.name)
        ready(worker, timeout=60)
        token = uuid.uuid4().hex
        (job,) = w.launcher.enqueue(
            {"task": "tests.keyed", "kwargs": {"account": token, "token": token, "seconds": 2}}
        )
        job_id = uuid.UUID(job["job_id"])
        eventually(lambda: run_row(pg, job_id)["state"] == "running", timeout=30, interval=0.01)
        # A warm shutdown: the job ends, then the worker, its last events held.
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
        w.watch.until(w.host, 3, timeout=10)

    assert run_row(pg, job_id)["state"] == "succeeded"
    task_id = task_id_for(job_id, 1)
    for kind in ("task-received", "task-started", "task-succeeded"):
        assert task_id in _events_of(w.watch, w.host, kind), kind


def test_a_pool_child_replaced_after_each_task_sends_its_events_before_it_exits(
    pg: Engine, postgres_url: str, module_redis: RedisServer, tmp_path: Path
) -> None:
    """``--max-tasks-per-child=1`` (a team's cure for a leaking library): each child leaves
    right after its task, with os._exit. Its task-started event (the one that carries the
    user's call to Flower) was still held: none of the jobs' arrived before the fix."""
    with _watched(f"replaced-{SESSION}", postgres_url, module_redis, tmp_path) as w:
        token = uuid.uuid4().hex[:8]
        jobs = w.launcher.enqueue(
            *({"task": "tests.echo", "kwargs": {"token": f"{token}-{i}"}} for i in range(4))
        )
        ready(w.launcher.worker(w.name, flags=["--max-tasks-per-child=1"]), timeout=60)
        w.watch.until(w.host, 3 * len(jobs), timeout=60)

    assert {run_row(pg, uuid.UUID(job["job_id"]))["state"] for job in jobs} == {"succeeded"}
    ids = {task_id_for(uuid.UUID(job["job_id"]), 1) for job in jobs}
    for kind in ("task-received", "task-started", "task-succeeded"):
        assert set(_events_of(w.watch, w.host, kind)) == ids, kind
