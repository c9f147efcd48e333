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

from sqlalchemy import Engine, and_, case, func, or_, select

from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.journal.workflow import FAILURE, STEPS, step_runs
from jobsapp.lifecycle.rules.states import ACTIVE_STATES, State

# A workflow's state for the summary line, from its steps: ``running`` while a step is
# queued or running (a replayed step too) or waits for a step still to come; else
# ``failed`` if a step failed or is blocked; else ``succeeded``. An errback that never ran
# is not waited for: it runs only if its step fails.
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
    """How many workflows are running, succeeded and failed (one GROUP BY per run table
    the steps name; bounded, as the run tables are, by journal retention)."""
    flags: dict[uuid.UUID, tuple[bool, bool, bool]] = {}
    with engine.connect() as conn:
        for module in conn.execute(select(STEPS.c.module).distinct()).scalars():
            for workflow_id, *seen in conn.execute(_flags(module)):
                before = flags.get(workflow_id, (False, False, False))
                active, failed, waiting = (bool(a or b) for a, b in zip(before, seen, strict=True))
                flags[workflow_id] = (active, failed, waiting)
    counts = dict.fromkeys(WORKFLOW_STATES, 0)
    for active, failed, waiting in flags.values():
        counts[_state(active=active, failed=failed, waiting=waiting)] += 1
    return counts


def _state(*, active: bool, failed: bool, waiting: bool) -> str:
    if active or (waiting and not failed):
        return "running"
    return "failed" if failed else "succeeded"


def _flags(module: str) -> Any:
    """Per workflow, over its steps of ``module``: a run queued or running; a run failed
    or a step blocked; a step (not an errback) with no run yet."""
    table = registry.get(module).table

    def any_of(condition: Any) -> Any:
        return func.max(case((condition, 1), else_=0))

    failed = or_(table.c.state == State.FAILED.value, STEPS.c.blocked_at.is_not(None))
    waiting = and_(
        table.c.job_id.is_(None), STEPS.c.blocked_at.is_(None), STEPS.c.trigger != FAILURE
    )
    return (
        select(
            STEPS.c.workflow_id,
            any_of(table.c.state.in_(ACTIVE_STATES)),
            any_of(failed),
            any_of(waiting),
        )
        .select_from(STEPS.outerjoin(table, table.c.job_id == STEPS.c.job_id))
        .where(STEPS.c.module == module)
        .group_by(STEPS.c.workflow_id)
    )
