"""Tasks that return values, as lifecycle tasks and as bare Celery tasks with a result
backend (Redis), so a test can put Celery's answer beside jobsapp's."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from celery import Celery
from celery.contrib.testing.worker import start_worker

from jobsapp.celery_app import app
from jobsapp.lifecycle import current_run, lifecycle_task
from tests.support.env import SESSION, service
from tests.support.first_hour_tasks import _add, _refuse
from tests.support.tasks import record


class Opaque:
    """A value no JSON encoder knows."""


def _opaque(token: str) -> Opaque:
    record(token)
    return Opaque()


def _sized(token: str, length: int) -> str:
    record(token)
    return "x" * length


def _parsed(text: str) -> datetime:
    return datetime.fromisoformat(text)


@lifecycle_task(app, name="tests.results.structured")
def structured(x: int) -> dict[str, object]:
    return {"pair": (x, x + 1), "nested": {"ok": True, "none": None}}


@lifecycle_task(app, name="tests.results.completes")
def completes(x: int) -> str:
    with current_run().completing(result={"kept": x}):
        pass
    return "returned after the run succeeded: not kept"


opaque = lifecycle_task(app, name="tests.results.opaque")(_opaque)
parsed = lifecycle_task(app, name="tests.results.parsed")(_parsed)
sized = lifecycle_task(app, name="tests.results.sized")(_sized)


BODIES: Mapping[str, Callable[..., Any]] = {
    "add": _add,
    "refuse": _refuse,
    "opaque": _opaque,
    "parsed": _parsed,
}


@contextmanager
def bare_worker(bodies: Mapping[str, Callable[..., Any]] = BODIES) -> Iterator[Celery]:
    """A bare Celery app with a Redis result backend and an in-process worker of its own,
    on a queue of this test session, running ``bodies`` as ``bare.results.<name>``;
    jobsapp's app stays the current one."""
    url = service("JOBSAPP_TEST_REDIS_URL")
    bare = Celery("bare-results", broker=url, backend=url)
    bare.conf.task_default_queue = f"bare-results-{SESSION}"
    for name, body in bodies.items():
        bare.task(name=f"bare.results.{name}")(body)
    try:
        with start_worker(bare, pool="threads", concurrency=2, perform_ping_check=False):
            yield bare
    finally:
        app.set_current()
        app.set_default()
