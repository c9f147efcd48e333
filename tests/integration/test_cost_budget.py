"""The cost budget: what one job may cost on the producer and in the worker, counted (SQL
statements, commits, broker publishes, Python calls; bench/cost.py) and held against
tests/cost_budget.json on Postgres and SQLite: the no-op lifecycle job, and the same job
with each feature it may use (a chain of 3, a group of 10, a chord of 10, a key limit, a
rate limit, a priority), per job; the no-op job's Python calls in a whole solo worker too
(the consumer around the task, its events, every thread). A change over the budget fails
here; a change that lowers a count must lower the budget too (a budget with slack would
let the next change spend it unseen): ``COST_BUDGET_UPDATE=1`` rewrites the file from
this run. Bare Celery, with the same events, is counted beside it for the ratios
docs/performance.md reports. Each side is counted in a fresh process, so no earlier
test's state moves a count."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sqlalchemy import Engine

from bench.cost import BARE, NOOP, SOLO, Measured, measured
from tests.support.env import SESSION, service

BUDGET = Path(__file__).resolve().parents[1] / "cost_budget.json"

# Python call counts move a little with what a warm process has cached; the rest are exact.
CALLS_SLACK = 0.03


def _dialect(db: Engine) -> str:
    return "sqlite" if db.dialect.name == "sqlite" else "postgres"


def _over(now: Measured, kept: Measured) -> list[str]:
    """Every count over its budget, or under it by more than the slack."""
    found = []
    for feature, sides in now.items():
        for side, counts in sides.items():
            for name, value in counts.items():
                budget = kept[feature][side][name]
                slack = budget * CALLS_SLACK if name == "calls" else 0.0
                if not budget - slack <= value <= budget + slack:
                    found.append(f"{feature}, {side} {name}: {value} per job, budget {budget}")
    return found


def test_a_job_and_each_feature_stay_within_their_cost_budget(db: Engine) -> None:
    env = {**os.environ, "JOBSAPP_BROKER_URL": service("JOBSAPP_TEST_REDIS_URL")}
    ours = measured("lifecycle", f"cost-lifecycle-{SESSION}", env)
    theirs = measured("bare", f"cost-bare-{SESSION}", env)
    dialect = _dialect(db)
    kept = json.loads(BUDGET.read_text()) if BUDGET.exists() else {}
    if os.environ.get("COST_BUDGET_UPDATE") == "1":
        kept[dialect] = {**ours, **theirs}
        BUDGET.write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")
    for side in ("producer", "worker", SOLO):
        ratio = ours[NOOP][side]["calls"] / theirs[BARE][side]["calls"]
        print(f"lifecycle/bare {side} calls per job ({dialect}): {ratio:.2f}")
    missed = _over(ours, kept[dialect])
    assert not missed, (
        f"a job's cost moved (COST_BUDGET_UPDATE=1 rewrites {BUDGET.name} once the change "
        f"is meant): {missed}"
    )
