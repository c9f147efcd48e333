"""``jobsapp summary`` ends with the jobs per module, state and outcome: queued and running
ones counted live, finished ones as beat's rollup counted them (journal/finished_counts.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from jobsapp import cli, operator
from jobsapp.celery_app import app
from jobsapp.maintenance import retention
from jobsapp.monitor import summary
from tests.support.planted import (
    JOBS,
    ago,
    failed_job,
    queued_job,
    rolled_up,
    set_row,
    succeeded_job,
)


def _counts_table(capsys: pytest.CaptureFixture[str]) -> list[list[str]]:
    assert cli.main(["summary", "--module", "jobs"]) == 0
    out = capsys.readouterr().out
    return [line.split() for line in out.split("\n\n", 1)[1].splitlines()]


def test_summary_counts_jobs_per_state_and_outcome(
    db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    for make in (queued_job, succeeded_job, succeeded_job, failed_job):
        make(db)
    rolled_up(db)

    assert _counts_table(capsys) == [
        ["MODULE", "STATE", "OUTCOME", "JOBS"],
        ["jobs", "queued", "-", "1"],
        ["jobs", "succeeded", "succeeded", "2"],
        ["jobs", "failed", "permanent", "1"],
    ]


def _jobs(db: Engine) -> dict[str, int]:
    return summary.counts(db)["jobs"]


def test_a_finished_job_is_counted_once_after_a_rollup_pass(db: Engine) -> None:
    running = queued_job(db)
    assert _jobs(db)["queued"] == 1  # active runs are counted live
    job_id = failed_job(db, job_id=running)
    assert _jobs(db) == {"queued": 0, "running": 0, "succeeded": 0, "failed": 0}

    rolled_up(db)
    assert _jobs(db)["failed"] == 1
    rolled_up(db)
    assert _jobs(db)["failed"] == 1  # a second pass adds nothing

    # A replay takes the counted failure off in its own transaction, no pass needed.
    operator.replay(db, JOBS.module, job_id, actor="ops", reason="try again", app=app)
    assert _jobs(db) == {"queued": 1, "running": 0, "succeeded": 0, "failed": 0}


def test_retention_takes_off_the_runs_it_deletes_that_were_counted(db: Engine) -> None:
    keep = retention.RetentionConfig()
    # Deleted before any pass counted it: nothing to take off, and no pass counts it later.
    unseen = succeeded_job(db)
    set_row(db, unseen, finished_at=ago(8 * 86400))
    assert retention.run_once(db, keep, app)[JOBS.module] == 1
    rolled_up(db)
    assert _jobs(db)["succeeded"] == 0

    counted = succeeded_job(db)
    rolled_up(db)
    assert _jobs(db)["succeeded"] == 1
    set_row(db, counted, finished_at=ago(8 * 86400))
    assert retention.run_once(db, keep, app)[JOBS.module] == 1
    assert _jobs(db)["succeeded"] == 0
