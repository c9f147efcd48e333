"""Lifecycle tasks for what the journal adds under Celery's result idioms
(tests/integration/test_result_journal.py); the idioms themselves run in tests/conformance/."""

from __future__ import annotations

import uuid
from typing import Any

from celery import chain
from sqlalchemy import update

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from jobsapp.lifecycle.context import current_run
from jobsapp.lifecycle.errors import LeaseLost
from jobsapp.lifecycle.tables import JobRun


@lifecycle_task(app, name="tests.idioms.add")
def add(x: int, y: int) -> int:
    return x + y


@lifecycle_task(app, name="tests.idioms.replaced", bind=True)
def replaced(self: Any, x: int) -> Any:
    return self.replace(add.s(x, 1))


@lifecycle_task(app, name="tests.idioms.replaced_by_chain", bind=True)
def replaced_by_chain(self: Any, x: int) -> None:
    self.replace(chain(add.s(x, 1), add.s(1)))


@lifecycle_task(app, name="tests.idioms.replaced_without_its_claim", bind=True, max_attempts=1)
def replaced_without_its_claim(self: Any, x: int) -> None:
    """Another claim takes the run (as after a lost claim), then the body replaces itself;
    the jobs whose replace was refused so are listed in ``LOST`` (the in-process worker's)."""
    ctx = current_run()
    runs = JobRun.__table__
    with ctx.engine.begin() as conn:
        conn.execute(
            update(runs).where(runs.c.job_id == ctx.job_id).values(claim_token=uuid.uuid4())
        )
    try:
        self.replace(add.s(x, 1))
    except LeaseLost:
        LOST.append(ctx.job_id)
        raise


LOST: list[uuid.UUID] = []
