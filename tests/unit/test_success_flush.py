"""JOBSAPP_FINISH_FLUSH=no-wait relaxes a success only where losing it runs the job again."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from jobsapp.lifecycle.journal import Run, StaleRun, registry
from jobsapp.lifecycle.journal.registry import StalePolicy
from jobsapp.lifecycle.worker.attempt import success_waits_for_flush
from jobsapp.maintenance import reaper
from tests.support.runs import a_run

FAIL_TABLE = dataclasses.replace(registry.JOBS, module="strict", stale_policy=StalePolicy.FAIL)


def claimed(attempt: int, max_attempts: int, rescues: int) -> Run:
    return a_run(state="running", attempts=attempt, max_attempts=max_attempts, rescues=rescues)


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "rescues", "waits"),
    [
        (1, 5, 0, False),  # the reaper would requeue the run a crash sent back to running
        (4, 5, 2, False),
        (5, 5, 0, True),  # the last attempt: the reaper would fail it stale
        (1, 1, 0, True),  # a single-attempt task
        (2, 5, 3, True),  # rescued three times: the reaper would fail it as a poison job
    ],
)
def test_a_no_wait_success_waits_where_the_reaper_would_not_run_it_again(
    attempt: int, max_attempts: int, rescues: int, waits: bool
) -> None:
    row = claimed(attempt, max_attempts, rescues)
    assert success_waits_for_flush(registry.JOBS, row, False) is waits
    # The same rule as the reaper's, for the run the lost success leaves behind.
    stale = StaleRun(
        job_id=uuid.uuid4(),
        attempt=attempt,
        rescues=rescues,
        max_attempts=max_attempts,
        task_name="tests.echo",
        ids={},
    )
    assert reaper.should_requeue(stale, registry.JOBS) is not waits


def test_a_fail_policy_table_always_waits() -> None:
    assert success_waits_for_flush(FAIL_TABLE, claimed(1, 5, 0), False) is True


def test_by_default_every_success_waits() -> None:
    assert success_waits_for_flush(registry.JOBS, claimed(1, 5, 0), True) is True
