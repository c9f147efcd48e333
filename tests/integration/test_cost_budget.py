"""The cost budget: what one no-op job may cost on the producer and in the worker, counted
(SQL statements, commits, broker publishes, Python calls; tests/support/cost.py) and held
against tests/cost_budget.json on Postgres and SQLite. A change over the budget fails here;
a change that lowers a count must lower the budget too (a budget with slack would let the
next change spend it unseen): ``COST_BUDGET_UPDATE=1`` rewrites the file from this run.
Bare Celery, with the same events, is counted beside it for the ratios docs/performance.md
reports. Each side is counted in a fresh process, so no earlier test's state moves a count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import redis
from sqlalchemy import Engine

from tests.support.env import SESSION, service

ROOT = Path(__file__).resolve().parents[2]
BUDGET = ROOT / "tests" / "cost_budget.json"
# Python call counts move a little with what a warm process has cached; the rest are exact.
CALLS_SLACK = 0.03


def _measured(side: str) -> dict[str, dict[str, float]]:
    queue = f"cost-{side}-{SESSION}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JOBSAPP_IMPORTS": "",
        "JOBSAPP_BROKER_URL": service("JOBSAPP_TEST_REDIS_URL"),
    }
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.support.cost", side, queue],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    finally:
        redis.Redis.from_url(service("JOBSAPP_TEST_REDIS_URL")).delete(queue)
    assert done.returncode == 0, done.stderr[-3000:]
    measured: dict[str, dict[str, float]] = json.loads(done.stdout.splitlines()[-1])
    return measured


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


def test_a_no_op_job_stays_within_its_cost_budget(db: Engine) -> None:
    ours, theirs = _measured("lifecycle"), _measured("bare")
    dialect = _dialect(db)
    kept = json.loads(BUDGET.read_text()) if BUDGET.exists() else {}
    if os.environ.get("COST_BUDGET_UPDATE") == "1":
        kept[dialect] = {"lifecycle": ours, "bare celery": theirs}
        BUDGET.write_text(json.dumps(kept, indent=2, sort_keys=True) + "\n")
    for side in ("producer", "worker"):
        ratio = ours[side]["calls"] / theirs[side]["calls"]
        print(f"lifecycle/bare {side} calls per job ({dialect}): {ratio:.2f}")
    missed = _over(ours, kept[dialect]["lifecycle"])
    assert not missed, (
        f"the no-op job's cost moved (COST_BUDGET_UPDATE=1 rewrites {BUDGET.name} once the "
        f"change is meant): {missed}"
    )
