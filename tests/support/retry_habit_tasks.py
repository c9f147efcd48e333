"""Celery's retry habits, each body declared once and run as a lifecycle task and as a bare
Celery task with the same options (tests/integration/test_retry_habits.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import Celery

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from tests.support.tasks import FAST_RETRY, record

# When each call of a body began, by token (the in-process workers share this process).
STARTS: dict[str, list[float]] = {}
ETA_SECONDS = 1.5


def _started(token: str) -> int:
    STARTS.setdefault(token, []).append(time.monotonic())
    return record(token)


def _unlisted(self: Any, token: str) -> None:
    _started(token)
    raise ValueError(f"not a listed exception: {token}")


def _bounded(self: Any, token: str) -> None:
    _started(token)
    self.retry(max_retries=1, countdown=0.2)


def _at_eta(self: Any, token: str) -> str:
    if _started(token) == 1:
        self.retry(eta=datetime.now(UTC) + timedelta(seconds=ETA_SECONDS))
    return "ran again"


HABITS: Mapping[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "unlisted": (
        _unlisted,
        {"autoretry_for": (ConnectionError,), "max_retries": 3, "default_retry_delay": 0},
    ),
    "bounded": (_bounded, {"max_retries": 5}),
    "at_eta": (_at_eta, {}),
}

LIFECYCLE = {
    name: lifecycle_task(
        app, name=f"tests.retry_habits.{name}", bind=True, retry_policy=FAST_RETRY, **options
    )(body)
    for name, (body, options) in HABITS.items()
}


def declare_bare(bare: Celery) -> dict[str, Any]:
    """The same bodies and options as plain tasks of ``bare``."""
    return {
        name: bare.task(name=f"bare.retry_habits.{name}", bind=True, **options)(body)
        for name, (body, options) in HABITS.items()
    }
