"""A ``journal.Run`` made in a test without a database: the values a rule reads, the rest
those of a run just enqueued."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from jobsapp.lifecycle.journal import Run
from jobsapp.lifecycle.journal.tables import JobRun

_ENQUEUED = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def a_run(**given: Any) -> Run:
    """A queued run of ``tests.echo`` at attempt 0, with ``given`` columns instead."""
    row: dict[str, Any] = {c.name: None for c in JobRun.__table__.c}
    row |= {
        "job_id": uuid.uuid4(),
        "task_name": "tests.echo",
        "concurrency_key": "k",
        "state": "queued",
        "attempts": 0,
        "max_attempts": 3,
        "rescues": 0,
        "created_at": _ENQUEUED,
        "updated_at": _ENQUEUED,
        **given,
    }
    return Run.from_row(row)
