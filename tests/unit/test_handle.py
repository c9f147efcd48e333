"""A handle's face: Celery's state names from the journal row, and a one-line repr."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from jobsapp.lifecycle.celery_api.handle import JobHandle, celery_state
from jobsapp.lifecycle.journal import EnqueueOutcome, Run, registry
from jobsapp.lifecycle.journal.workflow import Blocked
from tests.support.runs import a_run

JOB_ID = uuid.UUID("3f2a61c4-0d7e-4b8a-9c1f-5e6d7a8b9c0d")


def row(state: str, outcome: str | None = None, attempts: int = 0) -> Run:
    return a_run(state=state, outcome=outcome, attempts=attempts)


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
def test_the_journal_state_in_celery_names(journal_row: Run | None, celery_name: str) -> None:
    assert celery_state(journal_row) == celery_name


def test_the_repr_is_one_line_naming_task_id_and_what_the_enqueue_answered() -> None:
    handle = JobHandle(JOB_ID, EnqueueOutcome.ENQUEUED, registry.JOBS, task="billing.invoice")

    assert repr(handle) == f"<JobHandle billing.invoice {JOB_ID} enqueued>"
    assert str(handle) == str(JOB_ID)  # Celery's str() of a result is its id


def test_a_handle_without_a_task_name_shows_its_module() -> None:
    handle = JobHandle(JOB_ID, EnqueueOutcome.DUPLICATE, registry.JOBS)

    assert repr(handle) == f"<JobHandle jobs {JOB_ID} duplicate>"


def test_a_blocked_step_reads_as_the_failed_run_a_handle_shows() -> None:
    """A step whose upstream failed has no run row: its stand-in fails under Celery's name
    and shows a handle the run row's names."""
    done = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    blocked = Blocked(JOB_ID, "billing.invoice", "upstream_failed", "the charge failed", done)

    assert celery_state(blocked) == "FAILURE"
    assert blocked.columns == {
        "job_id": JOB_ID,
        "task_name": "billing.invoice",
        "state": "failed",
        "outcome": "upstream_failed",
        "last_error": "the charge failed",
        "attempts": 0,
        "result": None,
        "finished_at": done,
    }
