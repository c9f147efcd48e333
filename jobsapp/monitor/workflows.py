"""A workflow's steps and where each stands, for the admin job page and ``jobsapp summary
--workflow`` (docs/workflows.md).

A step with a run answers with the run's state and outcome; one without is ``blocked``
(what it waited for failed: ``upstream_failed``, ``chord_failed``) or ``waiting``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, select

from jobsapp.lifecycle import registry
from jobsapp.lifecycle.journal.workflow import STEPS


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
        return {"path": self.path, "job_id": str(self.job_id), "module": self.module,
                "task": self.task_name, "state": self.state, "outcome": self.outcome}  # fmt: skip


def workflow_steps(engine: Engine, workflow_id: uuid.UUID) -> list[StepView]:
    """The workflow's steps in canvas order (none: no such workflow)."""
    with engine.connect() as conn:
        found = conn.execute(select(STEPS).where(STEPS.c.workflow_id == workflow_id))
        steps = [dict(row) for row in found.mappings()]
        runs = _runs(conn, steps)
    views = [_view(step, runs.get(step["job_id"])) for step in steps]
    return sorted(views, key=lambda v: _order(v.path))


def _runs(conn: Connection, steps: Sequence[Mapping[str, Any]]) -> dict[uuid.UUID, Any]:
    by_module: dict[str, list[uuid.UUID]] = {}
    for step in steps:
        by_module.setdefault(step["module"], []).append(step["job_id"])
    found: dict[uuid.UUID, Any] = {}
    for module, ids in by_module.items():
        table = registry.get(module).table
        rows = conn.execute(select(table.c.job_id, table.c.state, table.c.outcome)
                            .where(table.c.job_id.in_(ids)))  # fmt: skip
        found |= {row.job_id: row for row in rows}
    return found


def _view(step: Mapping[str, Any], run: Any) -> StepView:
    if run is not None:
        state, outcome = run.state, run.outcome
    elif step["blocked_at"] is not None:
        state, outcome = "blocked", step["blocked_outcome"]
    else:
        state, outcome = "waiting", None
    return StepView(step["path"], step["job_id"], step["module"], step["task_name"], state,
                    outcome, run is not None)  # fmt: skip


def _order(path: str) -> tuple[tuple[int, str], ...]:
    """Canvas order: "0.2" before "0.10", a chord's header before its body."""
    return tuple((int(p), "") if p.isdigit() else (1 << 30, p) for p in path.split("."))
