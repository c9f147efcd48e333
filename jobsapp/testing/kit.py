"""The test kit a user's suite gets as the ``jobsapp`` fixture (jobsapp/testing/plugin.py).

It runs the real lifecycle, not a mock of it: jobs are enqueued through the journal and its
outbox, and ``drain`` runs each published message as a worker would (Celery's tracer, the
claim with its fence, the finish, retries, workflows' next steps), in this process, one
message at a time. The journal is the embedded default's SQLite (or the database the
environment names), emptied before each test, and the broker's queues are purged with it.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.app.trace import build_tracer
from sqlalchemy import Engine, delete, inspect, select

from jobsapp.db import get_engine
from jobsapp.lifecycle import journal, registry
from jobsapp.lifecycle.handle import JobHandle
from jobsapp.lifecycle.journal import EnqueueOutcome
from jobsapp.lifecycle.results import decoded
from jobsapp.lifecycle.tables import Base

# What drain reports, by the state the job is in after the attempt it ran.
_SAID = {"succeeded": "succeeded", "failed": "failed", "queued": "retried", "running": "running"}


@dataclass(frozen=True)
class Run:
    """A run row as a test reads it."""

    job_id: Any
    task: str
    state: str
    outcome: str | None
    attempts: int
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    key: str
    queue: str | None
    priority: int | None
    last_error: str | None
    result: Any


class Kit:
    """Assertions on what was enqueued, and the jobs run here through the lifecycle."""

    def __init__(self, app: Celery, engine: Engine | None = None) -> None:
        self.app = app
        self.engine = engine or get_engine()

    # --- isolation ------------------------------------------------------------------

    def reset(self) -> None:
        """Empty the journal and the broker's queues: nothing leaks between tests."""
        present = set(inspect(self.engine).get_table_names())
        with self.engine.begin() as conn:
            for table in reversed(Base.metadata.sorted_tables):
                if table.name in present:
                    conn.execute(delete(table))
        with self.app.connection_for_write() as conn:
            channel: Any = conn.default_channel
            for queue in self._queues():
                channel.queue_purge(queue)

    def _queues(self) -> set[str]:
        return {str(self.app.conf.task_default_queue)}

    # --- what was enqueued ----------------------------------------------------------

    def runs(self, task: Any) -> list[Run]:
        """Every run of ``task``, oldest first."""
        spec = task.run_table
        table = spec.table
        stmt = select(table).where(table.c.task_name == task.name).order_by(table.c.created_at)
        with self.engine.connect() as conn:
            return [_run(spec, dict(row)) for row in conn.execute(stmt).mappings()]

    def enqueued(self, task: Any, **subset: Any) -> list[JobHandle]:
        """Handles of the queued jobs of ``task`` matching ``subset`` (``args``, ``kwargs``,
        ``key``, ``queue``, ``priority``): a job matches when each given field equals."""
        return [
            JobHandle(
                run.job_id, EnqueueOutcome.DUPLICATE, task.run_table, task=task.name, app=self.app
            )
            for run in self.runs(task)
            if run.state == "queued" and _matches(run, subset)
        ]

    def assert_enqueued(self, task: Any, **subset: Any) -> None:
        if not self.enqueued(task, **subset):
            raise AssertionError(
                f"no queued {task.name} job with {subset}; queued: {self._queued_of(task)}"
            )

    def refute_enqueued(self, task: Any, **subset: Any) -> None:
        found = self.enqueued(task, **subset)
        if found:
            raise AssertionError(
                f"{len(found)} queued {task.name} job(s) with {subset}: {self._queued_of(task)}"
            )

    def _queued_of(self, task: Any) -> list[dict[str, Any]]:
        return [
            {
                "args": r.args,
                "kwargs": r.kwargs,
                "key": r.key,
                "queue": r.queue,
                "priority": r.priority,
            }
            for r in self.runs(task)
            if r.state == "queued"
        ]

    def outbox(self) -> list[dict[str, Any]]:
        """The outbox rows: what was (or is to be) published, for assertions."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(journal.OUTBOX).order_by(journal.OUTBOX.c.id))
            return [dict(row) for row in rows.mappings()]

    # --- running jobs here ------------------------------------------------------------

    def drain(self, *, with_scheduled: bool = True, max_messages: int = 1000) -> Counter[str]:
        """Run every published message as a worker would, until none is left (a retry or a
        workflow's next step publishes another, which runs too); counts of the attempts by
        what they ended in: ``succeeded``, ``failed``, ``retried``. A message due later (a
        countdown, a retry's backoff) runs now when ``with_scheduled`` (the lifecycle waits
        it out inline), else it is left in the queue."""
        counts: Counter[str] = Counter()
        for _ in range(max_messages):
            message = self._next_message(with_scheduled)
            if message is None:
                return counts
            counts[self._run_message(message)] += 1
        raise AssertionError(f"drain ran {max_messages} messages and the queue is not empty")

    def perform(self, task: Any, *args: Any, **kwargs: Any) -> Run:
        """One job of ``task`` run here through the lifecycle, attempt after attempt, to
        its end; its run row (outcome, result, stored error)."""
        handle = task.apply(args, kwargs)
        runs = [r for r in self.runs(task) if str(r.job_id) == str(handle.id)]
        if not runs:
            raise AssertionError(f"{task.name}: apply() left no run (got {handle.result!r})")
        return runs[0]

    def _next_message(self, with_scheduled: bool) -> Any:
        with self.app.connection_for_read() as conn:
            for queue in self._queues():
                simple = conn.SimpleQueue(queue)
                try:
                    message = simple.get(block=False)
                except simple.Empty:
                    continue
                finally:
                    simple.close()
                eta = message.headers.get("eta")
                if eta and not with_scheduled:
                    message.requeue()
                    continue
                message.ack()
                return message
        return None

    def _run_message(self, message: Any) -> str:
        headers = message.headers
        args, kwargs, _embed = message.payload
        task = self.app.tasks[headers["task"]]
        trace = build_tracer(task.name, task, app=self.app, eager=False)
        trace(headers["id"], list(args), dict(kwargs), delivered(self.app, headers["id"], "kit"))
        return self._state_after(task, kwargs)

    def _state_after(self, task: Any, kwargs: Mapping[str, Any]) -> str:
        job_id = kwargs.get("job_id") if isinstance(kwargs, Mapping) else None
        if job_id is None or not hasattr(task, "run_table"):
            return "ran"
        with self.engine.connect() as conn:
            row = journal.load(conn, task.run_table, uuid.UUID(str(job_id)))
        return "not run" if row is None else _SAID.get(str(row["state"]), str(row["state"]))

    def wait_for(self, task: Any, state: str, timeout: float = 20.0) -> list[Run]:
        """With a real worker (``jobsapp_worker``): the runs of ``task`` once every one of
        them is in ``state``."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.runs(task)
            if found and all(r.state == state for r in found):
                return found
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{task.name}: not all {state} after {timeout}s: "
                    f"{[(r.state, r.last_error) for r in found]}"
                )
            time.sleep(0.05)


def _run(spec: registry.RunTable, row: dict[str, Any]) -> Run:
    params = decoded(row.get(spec.params_column) or {}) if spec.params_column else {}
    return Run(
        job_id=row["job_id"],
        task=row["task_name"],
        state=row["state"],
        outcome=row["outcome"],
        attempts=int(row["attempts"]),
        args=tuple(params.get("args", ())),
        kwargs=dict(params.get("kwargs", {})),
        key=row["concurrency_key"],
        queue=row.get("queue"),
        priority=row.get("priority"),
        last_error=row["last_error"],
        result=decoded(row["result"]),
    )


def _matches(run: Run, subset: Mapping[str, Any]) -> bool:
    shown = {
        "args": run.args,
        "kwargs": run.kwargs,
        "key": run.key,
        "queue": run.queue,
        "priority": run.priority,
    }
    unknown = set(subset) - set(shown)
    if unknown:
        raise TypeError(f"assert_enqueued matches on {sorted(shown)}, not {sorted(unknown)}")
    return all(shown[k] == (tuple(v) if k == "args" else v) for k, v in subset.items())


def delivered(app: Celery, task_id: str, host: str) -> dict[str, Any]:
    """The request Celery's tracer gets for a message a worker on ``host`` took from the
    app's default queue."""
    queue = str(app.conf.task_default_queue)
    return {
        "id": task_id,
        "hostname": f"{host}@{socket.gethostname()}",
        "is_eager": False,
        "delivery_info": {
            "routing_key": queue,
            "exchange": "",
            "priority": 0,
            "redelivered": False,
        },
    }
