"""Retention's workflow cut reads the oldest steps a page at a time: workflows still alive
past the cutoff at the front of the steps do not hide an aged one behind them (issue 37:
the cut no longer reads every step written since the cutoff to find them).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, func, select, update

from bench import planting
from jobsapp.db import utcnow
from jobsapp.lifecycle.journal.tables import JobRun
from jobsapp.lifecycle.journal.workflow import STEPS
from jobsapp.maintenance import retention

RUNS = JobRun.__table__
KEEP = retention.RetentionConfig(runs=timedelta(days=5), batch=2, max_batches=1)


def _workflows_oldest_first(db: Engine) -> list[object]:
    s = STEPS.c
    stmt = select(s.workflow_id).group_by(s.workflow_id).order_by(func.min(s.created_at))
    with db.connect() as conn:
        return list(conn.execute(stmt).scalars())


def _steps_of(db: Engine, workflow: object) -> int:
    with db.connect() as conn:
        stmt = select(func.count()).where(STEPS.c.workflow_id == workflow)
        return int(conn.execute(stmt).scalar_one())


def test_workflows_alive_past_the_cutoff_do_not_hold_back_an_aged_one(
    pg: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One step a page per workflow of the batch: a page of 2 steps.
    monkeypatch.setattr(retention, "STEPS_READ", 1)
    planting.plant(
        pg, {planting.Kind.CHAIN: 4}, start=utcnow() - timedelta(days=9), spread=timedelta(hours=4)
    )
    first, second, third, fourth = _workflows_oldest_first(pg)
    with pg.begin() as conn:  # the two oldest wait on a queued last step
        for alive in (first, second):
            newest = RUNS.c.finished_at.desc()
            last = select(RUNS.c.job_id).where(RUNS.c.workflow_id == alive).order_by(newest)
            conn.execute(
                update(RUNS)
                .where(RUNS.c.job_id == last.limit(1).scalar_subquery())
                .values(state="queued", finished_at=None, outcome=None)
            )

    counts = retention.run_once(pg, KEEP)

    assert counts["workflows"] == 2
    assert [_steps_of(pg, w) for w in (first, second, third, fourth)] == [3, 3, 0, 0]
