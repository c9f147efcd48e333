"""A workflow's steps and where each stands, for the admin job page and ``jobsapp summary
--workflow`` (docs/workflows.md); and how many workflows stand where, for ``jobsapp
summary``'s workflows line.

A step with a run answers with the run's state and outcome; one without is ``blocked``
(what it waited for failed: ``upstream_failed``, ``chord_failed``) or ``waiting``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, select

from jobsapp.lifecycle.journal import finished_counts, registry
from jobsapp.lifecycle.journal.reads import step_runs
from jobsapp.lifecycle.journal.workflow import STEPS
from jobsapp.lifecycle.rules.states import ACTIVE_STATES

# A workflow's state for the summary line (finished_counts.workflow_state): ``running``
# while a step is queued or running (a replayed step too); else ``failed`` if a step failed
# or is blocked; else ``succeeded``. An errback that never ran is not waited for.
WORKFLOW_STATES = ("running", "succeeded", "failed")


@dataclass(frozen=True)
class StepView:
    path: str
    job_id: uuid.UUID
    module: str
    task_name: str
    # The run's state, or "blocked" / "waiting" for a step with no run yet.
    state: str
    outcome: str | None
    has_run: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "job_id": str(self.job_id),
            "module": self.module,
            "task": self.task_name,
            "state": self.state,
            "outcome": self.outcome,
        }


def workflow_steps(engine: Engine, workflow_id: uuid.UUID) -> list[StepView]:
    """The workflow's steps in canvas order (none: no such workflow)."""
    with engine.connect() as conn:
        found = conn.execute(select(STEPS).where(STEPS.c.workflow_id == workflow_id))
        steps = [dict(row) for row in found.mappings()]
        runs = step_runs(conn, steps, "state", "outcome")
    views = [_view(step, runs.get(step["job_id"])) for step in steps]
    return sorted(views, key=lambda v: _order(v.path))


def _view(step: Mapping[str, Any], run: Any) -> StepView:
    if run is not None:
        state, outcome = run.state, run.outcome
    elif step["blocked_at"] is not None:
        state, outcome = "blocked", step["blocked_outcome"]
    else:
        state, outcome = "waiting", None
    return StepView(
        step["path"],
        step["job_id"],
        step["module"],
        step["task_name"],
        state,
        outcome,
        run is not None,
    )


def _order(path: str) -> tuple[tuple[int, str], ...]:
    """Canvas order: "0.2" before "0.10", a chord's header before its body."""
    return tuple((int(p), "") if p.isdigit() else (1 << 30, p) for p in path.split("."))


def workflow_counts(engine: Engine) -> dict[str, int]:
    """How many workflows are running (a step queued or running, read on each run table's
    state index: bounded by the active runs) and how many finished, as the rollup counted
    them (journal/finished_counts.py)."""
    running: set[uuid.UUID] = set()
    with engine.connect() as conn:
        for spec in registry.all_tables():
            t = spec.table
            stmt = select(t.c.workflow_id).where(
                t.c.state.in_(ACTIVE_STATES), t.c.workflow_id.is_not(None)
            )
            running.update(conn.execute(stmt.distinct()).scalars())
        finished = finished_counts.workflow_totals(conn)
    counts = {state: finished.get(state, 0) for state in WORKFLOW_STATES}
    counts[finished_counts.RUNNING] = len(running)
    return counts
