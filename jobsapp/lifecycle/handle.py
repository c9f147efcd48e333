"""What a producer gets back from an enqueue: the job id, the outcome, the journal state.

It answers the calls code written against Celery's ``AsyncResult`` makes (``id``,
``state``/``status``, ``ready()``, ``successful()``, ``failed()``, ``get()``) from the
journal; there is no result backend, so ``get()`` of a success returns None.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery import exceptions as celery_exceptions

from jobsapp.db import get_engine
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import EnqueueOutcome
from jobsapp.lifecycle.registry import RunTable
from jobsapp.lifecycle.states import State, is_terminal


class JobTimeout(TimeoutError, celery_exceptions.TimeoutError):
    """The job was not terminal in time; catchable as either library's TimeoutError."""


class JobFailed(Exception):
    """``get()`` of a failed job: its outcome and stored (scrubbed) error."""

    def __init__(self, job_id: uuid.UUID, outcome: str | None, error: str | None) -> None:
        super().__init__(f"job {job_id} failed ({outcome}): {error}")
        self.job_id, self.outcome, self.error = job_id, outcome, error


@dataclass(frozen=True)
class JobHandle:
    """The journal, not a Celery result backend, says how the job is doing."""

    job_id: uuid.UUID
    outcome: EnqueueOutcome
    spec: RunTable
    holder: uuid.UUID | None = None
    # The caller's own Celery task id, when it named the job by one.
    task_id: str | None = None

    @property
    def id(self) -> str:
        """Celery's AsyncResult spelling, for code that reads ``.id``: the caller's task id
        if it gave one, else the job id."""
        return self.task_id or str(self.job_id)

    def row(self) -> Mapping[str, Any] | None:
        with get_engine().connect() as conn:
            return journal.load(conn, self.spec, self.job_id)

    def state(self) -> str | None:
        row = self.row()
        return None if row is None else str(row["state"])

    @property
    def status(self) -> str | None:
        return self.state()

    def ready(self) -> bool:
        state = self.state()
        return state is not None and is_terminal(state)

    def successful(self) -> bool:
        return self.state() == State.SUCCEEDED.value

    def failed(self) -> bool:
        return self.state() == State.FAILED.value

    def wait(self, timeout: float | None = 30.0, interval: float = 0.1) -> Mapping[str, Any]:
        """Poll the journal until the job is terminal (None: no limit); JobTimeout names
        the last state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            row = self.row()
            if row is not None and is_terminal(row["state"]):
                return row
            if deadline is not None and time.monotonic() > deadline:
                state = None if row is None else row["state"]
                raise JobTimeout(f"job {self.job_id} still {state} after {timeout}s")
            time.sleep(interval)

    def get(
        self, timeout: float | None = None, propagate: bool = True, interval: float = 0.5
    ) -> None:
        """Celery's ``get``: None once succeeded; ``JobFailed`` with the stored error once
        failed (unless ``propagate`` is false); ``JobTimeout`` after ``timeout`` seconds."""
        row = self.wait(timeout, interval)
        if propagate and row["state"] == State.FAILED.value:
            raise JobFailed(self.job_id, row["outcome"], row["last_error"])
