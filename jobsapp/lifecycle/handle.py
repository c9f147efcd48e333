"""What a producer gets back from an enqueue: the job id, the outcome, the journal state."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jobsapp.db import get_engine
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import EnqueueOutcome
from jobsapp.lifecycle.registry import RunTable
from jobsapp.lifecycle.states import is_terminal


@dataclass(frozen=True)
class JobHandle:
    """The journal, not a Celery result backend, says how the job is doing."""

    job_id: uuid.UUID
    outcome: EnqueueOutcome
    spec: RunTable
    holder: uuid.UUID | None = None

    @property
    def id(self) -> str:
        """Celery's AsyncResult spelling, for code that reads ``.id``."""
        return str(self.job_id)

    def row(self) -> Mapping[str, Any] | None:
        with get_engine().connect() as conn:
            return journal.load(conn, self.spec, self.job_id)

    def state(self) -> str | None:
        row = self.row()
        return None if row is None else str(row["state"])

    def wait(self, timeout: float = 30.0, interval: float = 0.1) -> Mapping[str, Any]:
        """Poll the journal until the job is terminal; TimeoutError names the last state."""
        deadline = time.monotonic() + timeout
        while True:
            row = self.row()
            if row is not None and is_terminal(row["state"]):
                return row
            if time.monotonic() > deadline:
                state = None if row is None else row["state"]
                raise TimeoutError(f"job {self.job_id} still {state} after {timeout}s")
            time.sleep(interval)
