"""``jobsapp summary`` ends with the jobs per module, state and outcome: queued and running
ones counted live, finished ones as beat's rollup counted them (journal/finished_counts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, inspect

from jobsapp import cli, operator
from jobsapp.celery_app import app
from jobsapp.lifecycle import journal
from jobsapp.maintenance import retention
from jobsapp.monitor import summary
from tests.support.journal_view import held_by
from tests.support.migrations import each_dialect_down_and_up
from tests.support.planted import (
    JOBS,
    ago,
    claimed,
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


def test_a_finish_that_commits_late_is_counted_late_not_lost(pg: Engine) -> None:
    """A finish stamps its transaction's start; a pass while it is still open must not move
    the cursor past that stamp, or the run would never be counted (and retention would
    later take off a run that never was)."""
    slow = queued_job(pg)
    attempt = claimed(pg, JOBS, slow)
    with pg.begin() as conn:
        token = held_by(conn, JOBS, slow)
        assert journal.succeed(conn, JOBS, slow, attempt, token=token, actor="w1@host")
        succeeded_job(pg)  # finished and committed while the first is still open
        rolled_up(pg)
        assert _jobs(pg)["succeeded"] == 0  # held back behind the open transaction
    rolled_up(pg)
    assert _jobs(pg)["succeeded"] == 2


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) & {"run_counts", "workflow_counts"}
    finally:
        engine.dispose()


def test_migration_0026_goes_down_and_up_again_on_both_dialects(tmp_path: Path) -> None:
    each_dialect_down_and_up(tmp_path, "m0026", "0025", _tables, {"run_counts", "workflow_counts"})
