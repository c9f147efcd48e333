"""What a producer gets back from an enqueue: Celery's ``AsyncResult`` of the job.

Every Celery method works on it (``get``, ``state``, ``info``, ``ready``, ``traceback``,
``forget``, ``revoke``, ``parent``, ...), answered by the journal through its result
backend (lifecycle/celery_api/backend.py), so ``isinstance(handle, AsyncResult)`` holds. It adds
what the enqueue said (``outcome``, ``holder``: the job holding the key of a ``skipped``
one), the ``job_id`` and the journal's own state and row.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from celery import Celery, states
from celery.result import AsyncResult

from jobsapp.db import get_engine
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.celery_api.backend import JobFailed, celery_state, for_app
from jobsapp.lifecycle.journal import EnqueueOutcome
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules.states import is_terminal

__all__ = ["JobFailed", "JobHandle", "JobTimeout", "celery_state"]


class JobTimeout(TimeoutError):
    """``settled`` found the job not terminal in time."""


class JobHandle(AsyncResult[Any]):
    """The journal, through Celery's result backend API, says how the job is doing."""

    def __init__(
        self,
        job_id: uuid.UUID,
        outcome: EnqueueOutcome,
        spec: RunTable,
        holder: uuid.UUID | None = None,
        task: str | None = None,
        task_id: str | None = None,
        *,
        app: Celery | None = None,
        parent: AsyncResult[Any] | None = None,
    ) -> None:
        self.job_id, self.spec, self._task = job_id, spec, task
        self._outcome, self._holder = outcome, holder
        super().__init__(task_id or str(job_id), task_name=task, app=app, parent=parent)
        # A team's app may keep its own backend for plain tasks; a job's answers are the
        # journal's whatever the app's backend is.
        self.backend = for_app(self.app)

    def __repr__(self) -> str:
        return f"<JobHandle {self._task or self.spec.module} {self.id} {self._said()}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restored, (self.job_id, self.spec.module, self._task, self.id))

    def _maybe_set_cache(self, meta: Any) -> Any:
        """Celery keeps a ready result for good; the journal can take a failed job again (an
        operator's replay), so only a success is final enough to keep."""
        if meta and meta["status"] == states.SUCCESS:
            return super()._maybe_set_cache(meta)  # type: ignore[misc]
        return meta

    def _said(self) -> str:
        """What the enqueue answered, for the repr (no query: a repr must not do I/O)."""
        return str(self.outcome)

    @property
    def outcome(self) -> EnqueueOutcome:
        """What the enqueue did (``enqueued``, ``duplicate``, ``skipped``); a handle built
        from an id says what a replayed enqueue would: ``duplicate``."""
        return self._outcome

    @property
    def holder(self) -> uuid.UUID | None:
        """The job that holds the key, when this one was ``skipped``."""
        return self._holder

    @property
    def task(self) -> str | None:
        """The task's name, as the caller knew it (no query)."""
        return self._task

    def row(self) -> Mapping[str, Any] | None:
        """The job's run row now (None: no row yet)."""
        with get_engine().connect() as conn:
            run = journal.load(conn, self.spec, self.job_id)
            return None if run is None else run.columns

    @property
    def journal_state(self) -> str | None:
        """The journal's own state (``queued``, ``running``, ...); None: no row."""
        row = self.row()
        return None if row is None else str(row["state"])

    def settled(self, timeout: float | None = 30.0, interval: float = 0.1) -> Mapping[str, Any]:
        """Poll the journal until the job is terminal (None: no limit) and return its row;
        ``JobTimeout`` names the last state. Celery's ``wait`` is ``get``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            row = self.row()
            if row is not None and is_terminal(row["state"]):
                return row
            if deadline is not None and time.monotonic() > deadline:
                state = None if row is None else row["state"]
                raise JobTimeout(f"job {self.job_id} still {state} after {timeout}s")
            time.sleep(interval)

    def revoke(
        self,
        connection: Any = None,
        terminate: bool = False,
        signal: str | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Celery's revoke, kept in the journal first whatever the app's control is: a
        queued job never runs; a running one is asked to stop (killed with ``terminate``)."""
        from jobsapp.lifecycle.celery_api.revoke import revoke_in_journal

        revoke_in_journal(
            self.app,
            [self.id],
            connection=connection,
            terminate=terminate,
            signal=signal or "SIGTERM",
            reply=wait,
            timeout=timeout,
        )


def _restored(job_id: uuid.UUID, module: str, task: str | None, task_id: str) -> JobHandle:
    from jobsapp.lifecycle.journal import registry

    return JobHandle(
        job_id, EnqueueOutcome.DUPLICATE, registry.get(module), task=task, task_id=task_id
    )
