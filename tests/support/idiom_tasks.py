"""Lifecycle tasks for what the journal adds under Celery's result idioms
(tests/integration/test_result_journal.py); the idioms themselves run in tests/conformance/."""

from __future__ import annotations

import uuid
from typing import Any

from celery import chain, chord, group
from sqlalchemy import update

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from jobsapp.lifecycle.journal.tables import JobRun
from jobsapp.lifecycle.rules.errors import LeaseLost
from jobsapp.lifecycle.worker.context import current_run


@lifecycle_task(app, name="tests.idioms.add")
def add(x: int, y: int) -> int:
    return x + y


@lifecycle_task(app, name="tests.idioms.replaced", bind=True)
def replaced(self: Any, x: int) -> Any:
    return self.replace(add.s(x, 1))


@lifecycle_task(app, name="tests.idioms.tsum")
def tsum(numbers: list[int]) -> int:
    return sum(numbers)


@lifecycle_task(app, name="tests.idioms.replaced_by_canvas", bind=True)
def replaced_by_canvas(self: Any, kind: str, x: int) -> Any:
    """Replaced by a chain (x + 1 + 1), a chord (the sum of x + i for i < 3) or a group."""
    members = group(add.s(x, i) for i in range(3))
    canvases = {"chain": chain(add.s(x, 1), add.s(1)), "chord": chord(members, tsum.s())}
    return self.replace(canvases.get(kind, members))


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
