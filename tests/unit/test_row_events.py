"""Which events a run row carries, by its state and its two columns (pure)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobsapp.lifecycle.journal.row_events import row_events

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def run(
    state: str, *, enqueued_by: str | None = "producer", claimed: bool = True, attempts: int = 1
) -> dict[str, Any]:
    finished = state in ("succeeded", "failed")
    return {
        "job_id": uuid.uuid4(),
        "state": state,
        "attempts": attempts,
        "worker": "w1",
        "enqueued_by": enqueued_by,
        "created_at": T0,
        "attempted_at": T0 + timedelta(seconds=1) if claimed else None,
        "finished_at": T0 + timedelta(seconds=2) if finished else None,
    }


@pytest.mark.parametrize(
    ("row", "carried"),
    [
        (run("queued", claimed=False), [("enqueue", 1)]),
        (run("running"), [("enqueue", 1), ("claim", 1)]),
        (run("succeeded"), [("enqueue", 1), ("claim", 1), ("succeed", 1)]),
        # Retried: the claim of attempt 1 is an event row now, attempt 2 is the row's.
        (run("queued", attempts=1), [("enqueue", 1)]),
        (run("succeeded", attempts=2), [("enqueue", 1), ("claim", 2), ("succeed", 2)]),
        # Failed: its claim was written as an event row with the failure.
        (run("failed"), [("enqueue", 1)]),
        # Journaled before migration 0015, or claimed by insert: the event rows are all.
        (run("succeeded", enqueued_by=None, claimed=False), []),
        (run("running", enqueued_by=None, claimed=False), []),
    ],
)
def test_a_row_carries_its_enqueue_and_its_current_claim_and_success_only(
    row: dict[str, Any], carried: list[tuple[str, int]]
) -> None:
    events = row_events("jobs", row)

    assert [(e["transition"], e["attempt"]) for e in events] == carried
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)
    assert all(e["actor"] == "w1" for e in events if e["transition"] != "enqueue")
