"""What a producer gets back from an enqueue: the job id, the outcome, the journal state.

It answers the calls code written against Celery's ``AsyncResult`` makes (``id``,
``state``/``status`` in Celery's names, ``ready()``, ``successful()``, ``failed()``,
``get()``, ``result``, ``traceback``, ``date_done``) from the journal, whose own state stays
at hand as ``journal_state``. The run row keeps the body's return value (``result``, see
lifecycle/results.py): there is no result backend to run.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery import exceptions as celery_exceptions
from celery import states as celery_states

from jobsapp.db import get_engine
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import EnqueueOutcome
from jobsapp.lifecycle.registry import RunTable
from jobsapp.lifecycle.results import decoded
from jobsapp.lifecycle.states import Outcome, State, is_terminal


class JobTimeout(TimeoutError, celery_exceptions.TimeoutError):
    """The job was not terminal in time; catchable as either library's TimeoutError."""


class JobFailed(Exception):
    """``get()`` of a failed job: its outcome and stored (scrubbed) error."""

    def __init__(self, job_id: uuid.UUID, outcome: str | None, error: str | None) -> None:
        super().__init__(f"job {job_id} failed ({outcome}): {error}")
        self.job_id, self.outcome, self.error = job_id, outcome, error


def _failure(row: Mapping[str, Any]) -> JobFailed:
    return JobFailed(row["job_id"], row["outcome"], row["last_error"])


def _answer(row: Mapping[str, Any] | None) -> Any:
    """Celery's ``result`` of a row: the kept return value once succeeded, the failure (an
    exception, as Celery gives it) once failed, None before."""
    if row is None or not is_terminal(row["state"]):
        return None
    return _failure(row) if row["state"] == State.FAILED.value else decoded(row["result"])


_REVOKED = (Outcome.CANCELLED.value, Outcome.EXPIRED.value)


def celery_state(row: Mapping[str, Any] | None) -> str:
    """The journal row's state in Celery's names, as ``AsyncResult.state`` would say it.

    No row is ``PENDING`` (Celery's answer for an id it does not know); a queued job is
    ``PENDING`` before its first attempt and ``RETRY`` after one; a cancelled or expired
    one is ``REVOKED`` (Celery's state for both); every other failure (exhausted,
    permanent, stale, skipped, ...) is ``FAILURE``, its journal outcome saying which.
    """
    if row is None:
        return celery_states.PENDING
    state = row["state"]
    if state == State.QUEUED.value:
        return celery_states.RETRY if row["attempts"] else celery_states.PENDING
    if state == State.RUNNING.value:
        return celery_states.STARTED
    if state == State.SUCCEEDED.value:
        return celery_states.SUCCESS
    if row["outcome"] in _REVOKED:
        return celery_states.REVOKED
    return celery_states.FAILURE


@dataclass(frozen=True)
class JobHandle:
    """The journal, not a Celery result backend, says how the job is doing."""

    job_id: uuid.UUID
    outcome: EnqueueOutcome
    spec: RunTable
    holder: uuid.UUID | None = None
    task: str | None = None
    # The caller's own Celery task id, when it named the job by one.
    task_id: str | None = None

    def __repr__(self) -> str:
        return f"<JobHandle {self.task or self.spec.module} {self.id} {self._said()}>"

    def _said(self) -> str:
        """What the enqueue answered, for the repr (no query: a repr must not do I/O)."""
        return str(self.outcome)

    @property
    def id(self) -> str:
        """Celery's AsyncResult spelling, for code that reads ``.id``: the caller's task id
        if it gave one, else the job id."""
        return self.task_id or str(self.job_id)

    def row(self) -> Mapping[str, Any] | None:
        with get_engine().connect() as conn:
            return journal.load(conn, self.spec, self.job_id)

    @property
    def journal_state(self) -> str | None:
        """The journal's own state (``queued``, ``running``, ...); None: no row."""
        row = self.row()
        return None if row is None else str(row["state"])

    @property
    def state(self) -> str:
        """Celery's name for the job's state now (``celery_state``)."""
        return celery_state(self.row())

    @property
    def status(self) -> str:
        return self.state

    def ready(self) -> bool:
        state = self.journal_state
        return state is not None and is_terminal(state)

    def successful(self) -> bool:
        return self.state == celery_states.SUCCESS

    def failed(self) -> bool:
        return self.state == celery_states.FAILURE

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
    ) -> Any:
        """Celery's ``get``: the body's return value once succeeded (as Celery's JSON gives
        it back: a tuple comes back a list, a datetime a datetime); ``JobFailed`` with the
        stored error once failed (returned instead when ``propagate`` is false);
        ``JobTimeout`` after ``timeout`` seconds."""
        row = self.wait(timeout, interval)
        if propagate and row["state"] == State.FAILED.value:
            raise _failure(row)
        return _answer(row)

    @property
    def result(self) -> Any:
        """Celery's ``result`` now, without waiting (``_answer``)."""
        return _answer(self.row())

    @property
    def date_done(self) -> datetime | None:
        """When the job ended (the run's ``finished_at``); None while it has not."""
        row = self.row()
        if row is None or not is_terminal(row["state"]):
            return None
        finished: datetime = row["finished_at"]
        return finished

    @property
    def traceback(self) -> str | None:
        """Celery's ``traceback``: the body's (scrubbed, bounded) traceback of the attempt
        that failed, while the job is ``FAILURE`` or ``RETRY``; None otherwise, and for a
        failure with no traceback (a reaped or cancelled run)."""
        with get_engine().connect() as conn:
            row = journal.load(conn, self.spec, self.job_id)
            if celery_state(row) not in (celery_states.FAILURE, celery_states.RETRY):
                return None
            assert row is not None
            detail = journal.attempt_failure(conn, self.spec, self.job_id, row["attempts"])
        shown = None if detail is None else detail.get("traceback")
        return shown if isinstance(shown, str) else None
