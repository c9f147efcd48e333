"""``jobsapp summary`` ends with the jobs per module, state and outcome."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine

from jobsapp import cli
from tests.support.planted import failed_job, queued_job, succeeded_job


def test_summary_counts_jobs_per_state_and_outcome(
    db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    for make in (queued_job, succeeded_job, succeeded_job, failed_job):
        make(db)

    assert cli.main(["summary", "--module", "jobs"]) == 0

    out = capsys.readouterr().out
    counts = out.split("\n\n", 1)[1].splitlines()
    assert [line.split() for line in counts] == [
        ["MODULE", "STATE", "OUTCOME", "JOBS"],
        ["jobs", "queued", "-", "1"],
        ["jobs", "succeeded", "succeeded", "2"],
        ["jobs", "failed", "permanent", "1"],
    ]
