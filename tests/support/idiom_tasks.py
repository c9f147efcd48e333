"""Bodies of Celery's everyday result idioms, declared the same on a bare Celery app and
as lifecycle tasks (tests/integration/test_result_conformance.py puts the two side by
side). Bound bodies read ``self.request`` and call ``update_state`` and ``retry`` as a
Celery user writes them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from tests.support.tasks import FAST_RETRY

# A body that shows progress holds here until the test has read it (both workers run in
# this process, on threads).
RELEASE: dict[str, threading.Event] = {}


def _add(x: int, y: int) -> int:
    return x + y


def _boom(token: str) -> None:
    raise ValueError(f"boom {token}")


def _request_seen(self: Any, x: int, k: int = 0) -> list[Any]:
    request = self.request
    return [request.id, list(request.args), dict(request.kwargs), request.retries]


def _progress(self: Any, token: str) -> str:
    self.update_state(state="PROGRESS", meta={"step": 1, "token": token})
    RELEASE.setdefault(token, threading.Event()).wait(20)
    return "done"


def _missing(token: str) -> None:
    raise KeyError(f"missing {token}")


def _retried_out(self: Any, token: str) -> None:
    self.retry(countdown=0, max_retries=1)


BODIES: Mapping[str, Callable[..., Any]] = {
    "add": _add,
    "boom": _boom,
    "request_seen": _request_seen,
    "progress": _progress,
    "missing": _missing,
    "retried_out": _retried_out,
}

# The same declaration on both apps: ``@app.task(**OPTIONS[name])``.
OPTIONS: Mapping[str, Mapping[str, Any]] = {
    "boom": {"max_retries": 0},
    "request_seen": {"bind": True},
    "progress": {"bind": True},
    "missing": {"autoretry_for": (KeyError,), "max_retries": 1, "default_retry_delay": 0},
    "retried_out": {"bind": True},
}

# jobsapp's own backoff between attempts is kept short here (Celery's retries above wait 0).
_LIFECYCLE_ONLY: Mapping[str, Mapping[str, Any]] = {"retried_out": {"retry_policy": FAST_RETRY}}

LIFECYCLE = {
    name: lifecycle_task(
        app, name=f"tests.idioms.{name}", **OPTIONS.get(name, {}), **_LIFECYCLE_ONLY.get(name, {})
    )(body)
    for name, body in BODIES.items()
}


@lifecycle_task(app, name="tests.idioms.replaced", bind=True)
def replaced(self: Any, x: int) -> None:
    self.replace(LIFECYCLE["add"].s(x, 1))
