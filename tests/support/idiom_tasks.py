"""Lifecycle tasks for what the journal adds under Celery's result idioms
(tests/integration/test_result_journal.py); the idioms themselves run in tests/conformance/."""

from __future__ import annotations

from typing import Any

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task


@lifecycle_task(app, name="tests.idioms.add")
def add(x: int, y: int) -> int:
    return x + y


@lifecycle_task(app, name="tests.idioms.replaced", bind=True)
def replaced(self: Any, x: int) -> None:
    self.replace(add.s(x, 1))
