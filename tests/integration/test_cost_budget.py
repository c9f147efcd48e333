"""The cost budget: what one no-op job may cost on the producer and in the worker, counted
(SQL statements, commits, broker publishes, Python calls; tests/support/cost.py) and held
against tests/cost_budget.json on Postgres and SQLite. A change over the budget fails here;
a change that lowers a count must lower the budget too (a budget with slack would let the
next change spend it unseen): ``COST_BUDGET_UPDATE=1`` rewrites the file from this run.
Bare Celery, with the same events, is counted beside it for the ratios docs/performance.md
reports."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from tests.support.cost import measure
from tests.support.env import SESSION, service

BUDGET = Path(__file__).resolve().parents[1] / "cost_budget.json"
# Python call counts move a little with what a warm process has cached; the rest are exact.
CALLS_SLACK = 0.03


def _noop() -> None:
    """The job whose cost is all lifecycle."""


noop = lifecycle_task(app, name="tests.cost.noop")(_noop)


@pytest.fixture
def bare() -> Iterator[Celery]:
    """Bare Celery on the same broker, with the events jobsapp ships."""
    bare = Celery("bare-cost", broker=service("JOBSAPP_TEST_REDIS_URL"))
    bare.conf.update(
        task_default_queue=f"bare-cost-{SESSION}",
        task_ignore_result=True,
        task_send_sent_event=True,
        task_acks_late=True,
    )
    bare.task(name="bare.cost.noop")(_noop)
    try:
        yield bare
    finally:
        app.set_current()
        app.set_default()


def _dialect(db: Engine) -> str:
    return "sqlite" if db.dialect.name == "sqlite" else "postgres"


def _over(now: dict[str, dict[str, float]], kept: dict[str, dict[str, float]]) -> list[str]:
    """Every count over its budget, or under it by more than the slack."""
    found = []
    for side, counts in now.items():
        for name, value in counts.items():
            budget = kept[side][name]
            slack = budget * CALLS_SLACK if name == "calls" else 0.0
            if not budget - slack <= value <= budget + slack:
                found.append(f"{side} {name}: {value} per job, budget {budget}")
    return found


def test_a_no_op_job_stays_within_its_cost_budget(
    db: Engine, bare: Celery, redis_clean: None
) -> None:
    ours = measure(app, noop)
    theirs = measure(bare, bare.tasks["bare.cost.noop"])
    dialect = _dialect(db)
    kept = json.loads(BUDGET.read_text()) if BUDGET.exists() else {}
    if os.environ.get("COST_BUDGET_UPDATE") == "1":
        kept[dialect] = {"lifecycle": ours, "bare celery": theirs}
        BUDGET.write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")
    for side in ("producer", "worker"):
        print(
            f"lifecycle/bare {side} calls per job ({dialect}): "
            f"{ours[side]['calls'] / theirs[side]['calls']:.2f}"
        )
    missed = _over(ours, kept[dialect]["lifecycle"])
    assert not missed, (
        "the no-op job's cost moved (COST_BUDGET_UPDATE=1 rewrites "
        f"{BUDGET.name} once the change is meant): {missed}"
    )
