"""The claim fence is written once (lifecycle/journal/fence.py) and every write uses it."""

from __future__ import annotations

import ast
from pathlib import Path

from sqlalchemy.dialects import postgresql

from jobsapp.lifecycle.journal.fence import held
from jobsapp.lifecycle.journal.tables import JobRun

PACKAGE = Path(__file__).resolve().parents[2] / "jobsapp"
HOME = PACKAGE / "lifecycle" / "journal" / "fence.py"


def _hand_written_fences(path: Path) -> list[int]:
    """Lines comparing a ``claim_token`` column (``x.c.claim_token == ...``) by hand; a
    ``journal.Run``'s field (``run.claim_token``) is a value, not a column."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Compare)
        and any(_is_token_column(side) for side in (node.left, *node.comparators))
    ]


def _is_token_column(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "claim_token"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "c"
    )


def test_no_module_but_the_fence_compares_a_claim_token_by_hand() -> None:
    copies = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != HOME and (lines := _hand_written_fences(path))
    }
    assert copies == {}, f"use jobsapp.lifecycle.journal.fence.held instead: {copies}"


def test_the_fence_names_the_run_its_attempt_its_claim_and_no_stop_request() -> None:
    table = JobRun.__table__
    where = " AND ".join(
        str(c.compile(dialect=postgresql.dialect())) for c in held(table, "j", 3, "t")
    )
    assert "job_runs.job_id = " in where
    assert "job_runs.attempts = " in where
    assert "job_runs.claim_token = " in where
    assert "job_runs.cancel_requested_at IS NULL" in where
    loose = held(table, "j", 3, "t", unless_stopped=False)
    assert len(loose) == len(held(table, "j", 3, "t")) - 1
