"""A handle's face: Celery's state names from the journal row, and a one-line repr."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from jobsapp.lifecycle.celery_api.handle import JobHandle, celery_state
from jobsapp.lifecycle.journal import EnqueueOutcome, registry

JOB_ID = uuid.UUID("3f2a61c4-0d7e-4b8a-9c1f-5e6d7a8b9c0d")


def row(state: str, outcome: str | None = None, attempts: int = 0) -> dict[str, Any]:
    return {"state": state, "outcome": outcome, "attempts": attempts}


@pytest.mark.parametrize(
    ("journal_row", "celery_name"),
    [
        (None, "PENDING"),  # Celery's answer for an id it does not know
        (row("queued"), "PENDING"),
        (row("queued", attempts=1), "RETRY"),  # a retry, a reaped run, a replay
        (row("running", attempts=1), "STARTED"),
        (row("succeeded", "succeeded", 1), "SUCCESS"),
        (row("failed", "exhausted", 5), "FAILURE"),
        (row("failed", "permanent", 1), "FAILURE"),
        (row("failed", "stale", 3), "FAILURE"),
        (row("failed", "cancelled", 0), "REVOKED"),
    ],
)
def test_the_journal_state_in_celery_names(
    journal_row: dict[str, Any] | None, celery_name: str
) -> None:
    assert celery_state(journal_row) == celery_name


def test_the_repr_is_one_line_naming_task_id_and_what_the_enqueue_answered() -> None:
    handle = JobHandle(JOB_ID, EnqueueOutcome.ENQUEUED, registry.JOBS, task="billing.invoice")

    assert repr(handle) == f"<JobHandle billing.invoice {JOB_ID} enqueued>"
    assert str(handle) == str(JOB_ID)  # Celery's str() of a result is its id


def test_a_handle_without_a_task_name_shows_its_module() -> None:
    handle = JobHandle(JOB_ID, EnqueueOutcome.DUPLICATE, registry.JOBS)

    assert repr(handle) == f"<JobHandle jobs {JOB_ID} duplicate>"
