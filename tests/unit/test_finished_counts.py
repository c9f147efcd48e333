"""Where a workflow stands, from its steps and their runs: what the workflows line counts."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from jobsapp.lifecycle.journal.finished_counts import standing

T0 = datetime(2026, 12, 4, tzinfo=UTC)


def _step(trigger: str = "start", blocked: bool = False) -> dict[str, Any]:
    return {
        "job_id": uuid.uuid4(),
        "module": "jobs",
        "trigger": trigger,
        "blocked_at": T0 if blocked else None,
    }


def _run(step: dict[str, Any], state: str, minutes: int | None = None) -> SimpleNamespace:
    finished = None if minutes is None else T0 + timedelta(minutes=minutes)
    return SimpleNamespace(job_id=step["job_id"], state=state, finished_at=finished)


def test_a_chain_with_a_step_to_come_runs() -> None:
    first, second = _step(), _step("success")
    got = standing([first, second], {first["job_id"]: _run(first, "succeeded", 1)})
    assert got.state == "running"


def test_a_finished_workflow_names_its_last_finished_run() -> None:
    first, second, errback = _step(), _step("success"), _step("failure")
    runs = {s["job_id"]: _run(s, "succeeded", m) for s, m in ((first, 1), (second, 2))}
    got = standing([first, second, errback], runs)
    assert got.state == "succeeded"  # an errback that never ran is not waited for
    assert got.last == (T0 + timedelta(minutes=2), second["job_id"], "jobs")


def test_a_failed_step_and_what_it_blocked_fail_the_workflow() -> None:
    first, blocked = _step(), _step("success", blocked=True)
    got = standing([first, blocked], {first["job_id"]: _run(first, "failed", 3)})
    assert got.state == "failed"


def test_a_queued_step_runs_whatever_failed_before() -> None:
    first, second = _step(), _step()
    runs = {first["job_id"]: _run(first, "failed", 1), second["job_id"]: _run(second, "queued")}
    assert standing([first, second], runs).state == "running"
