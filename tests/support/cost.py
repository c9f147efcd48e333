"""What one no-op job costs, counted rather than timed: SQL statements, commits, broker
publishes and Python function calls, on the producer (``.delay()``) and in the worker (the
task as Celery's tracer runs it from the delivered message), for a lifecycle task and for
the same task on bare Celery in the same process. Counts do not depend on the machine's
speed or load, so CI can hold a budget (tests/integration/test_cost_budget.py).

Only the calling thread is profiled: the heartbeat's thread ticks on a clock, not per job.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from types import FrameType
from typing import Any

from celery import Celery
from celery.app.trace import build_tracer
from celery.signals import after_task_publish, before_task_publish
from sqlalchemy import Engine, event

from jobsapp.testing.kit import delivered

# Jobs run before counting (caches, compiled statements, first connections), then counted.
WARM, COUNTED = 10, 40


@dataclass
class Counts:
    statements: float = 0
    commits: float = 0
    publishes: float = 0
    calls: float = 0

    def per_job(self, jobs: int) -> dict[str, float]:
        return {k: round(v / jobs, 1) for k, v in asdict(self).items()}


@contextmanager
def counting() -> Iterator[Counts]:
    """Count what runs in this thread inside the block: statements and commits on every
    engine (the journal's autocommit and relaxed variants too: an autocommit statement is
    its own transaction, counted as a statement only). Background threads (the outbox's
    batched marks, the heartbeat) work on a clock, not per job, and are left out."""
    counts = Counts()
    mine = threading.get_ident()

    def statement(*_: Any, **__: Any) -> None:
        if threading.get_ident() == mine:
            counts.statements += 1

    def commit(*_: Any) -> None:
        if threading.get_ident() == mine:
            counts.commits += 1

    def published(**_: Any) -> None:
        if threading.get_ident() == mine:
            counts.publishes += 1

    def profiled(_frame: FrameType, what: str, _arg: Any) -> None:
        if what == "call":
            counts.calls += 1

    event.listen(Engine, "before_cursor_execute", statement)
    event.listen(Engine, "commit", commit)
    after_task_publish.connect(published, weak=False)
    sys.setprofile(profiled)
    try:
        yield counts
    finally:
        sys.setprofile(None)
        after_task_publish.disconnect(published)
        event.remove(Engine, "before_cursor_execute", statement)
        event.remove(Engine, "commit", commit)


@contextmanager
def captured() -> Iterator[list[tuple[str, tuple[Any, ...], dict[str, Any]]]]:
    """The (task id, args, kwargs) of every message published inside the block."""
    sent: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def keep(body: Any = None, headers: Any = None, **_: Any) -> None:
        args, kwargs, _embed = body
        sent.append((str(headers["id"]), tuple(args), dict(kwargs)))

    before_task_publish.connect(keep, weak=False)
    try:
        yield sent
    finally:
        before_task_publish.disconnect(keep)


def measure(
    app: Celery, task: Any, call: Callable[[], Any] | None = None
) -> dict[str, dict[str, float]]:
    """The producer's and the worker's counts per job of ``task`` (called with no
    arguments unless ``call`` says how)."""
    enqueue = call or task.delay
    with captured() as sent:
        for _ in range(WARM):
            enqueue()
        with counting() as producer:
            for _ in range(COUNTED):
                enqueue()
    trace = build_tracer(task.name, task, app=app, eager=False)
    warm, counted = sent[:WARM], sent[WARM:]
    for task_id, args, kwargs in warm:
        trace(task_id, args, kwargs, delivered(app, task_id, "cost"))
    with counting() as worker:
        for task_id, args, kwargs in counted:
            trace(task_id, args, kwargs, delivered(app, task_id, "cost"))
    return {"producer": producer.per_job(COUNTED), "worker": worker.per_job(COUNTED)}


def _noop() -> None:
    """The job whose cost is all lifecycle."""


def _side(name: str, queue: str) -> tuple[Celery, Any]:
    """The app and the no-op task of one side: jobsapp's lifecycle task, or bare Celery on
    the same broker with the events jobsapp ships."""
    if name == "lifecycle":
        from jobsapp.celery_app import app
        from jobsapp.lifecycle import lifecycle_task

        app.conf.task_default_queue = queue
        return app, lifecycle_task(app, name="tests.cost.noop")(_noop)
    bare = Celery("bare-cost", broker=os.environ["JOBSAPP_BROKER_URL"])
    bare.conf.update(
        task_default_queue=queue,
        task_ignore_result=True,
        task_send_sent_event=True,
        task_acks_late=True,
    )
    return bare, bare.task(name="bare.cost.noop")(_noop)


if __name__ == "__main__":
    # A process of its own: the counts depend on nothing an earlier test left behind.
    side, queue = sys.argv[1], sys.argv[2]
    print(json.dumps(measure(*_side(side, queue))))
