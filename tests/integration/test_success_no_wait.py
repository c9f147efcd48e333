"""JOBSAPP_FINISH_FLUSH=no-wait on a real worker: every kind of success still lands whole.

A job of its own succeeds through the relaxed autocommit statement, a limited run and a
workflow step through a relaxed transaction that also frees the key's slot, grants its
waiter and starts the next step (docs/lifecycle.md, "A success may not wait for the
flush"). What a crash can lose is tests/chaos/test_success_flush_crash.py's.
"""

from __future__ import annotations

import uuid

import pytest
from celery import chain
from sqlalchemy import Engine, select

from jobsapp.lifecycle.journal.key_slots import SLOTS
from tests.support import canvas_tasks, limit_tasks, tasks
from tests.support.attachments import environment
from tests.support.journal_view import run_row
from tests.support.waiting import eventually
from tests.support.workers import in_process_worker

pytestmark = pytest.mark.timeout(120)


def test_plain_limited_and_workflow_successes_land_without_waiting_for_the_flush(
    db: Engine, redis_clean: None
) -> None:
    tenant = f"no-wait-{uuid.uuid4().hex[:8]}"
    token = f"no-wait-{uuid.uuid4()}"
    with environment(JOBSAPP_FINISH_FLUSH="no-wait"), in_process_worker():
        plain = tasks.echo.apply_async((token,)).job_id
        # More runs than the key's slots: each success hands its slot to a parked waiter.
        limited = [
            limit_tasks.limited_plain.apply_async((tenant, 0.05)).job_id
            for _ in range(limit_tasks.LIMIT + 2)
        ]
        workflow = chain(canvas_tasks.add.s(1, 2), canvas_tasks.add.s(3)).apply_async()
        assert workflow.get(timeout=30) == 6
        eventually(
            lambda: all(run_row(db, j)["state"] == "succeeded" for j in [plain, *limited]),
            timeout=30,
        )
    assert tasks.calls(token) == 1
    with db.connect() as conn:
        held = conn.execute(select(SLOTS.c.job_id).where(SLOTS.c.concurrency_key == tenant))
        assert held.all() == []
