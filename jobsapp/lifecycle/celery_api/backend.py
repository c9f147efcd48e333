"""Celery's result backend, answered from the journal: the run rows are the results.

``result_backend = "jobsapp.lifecycle.celery_api.backend:JournalBackend"`` (jobsapp's shipped config
sets it; ``lifecycle_task`` sets it on an app that has none) makes every Celery reader of
results work on lifecycle jobs: ``AsyncResult(id).get()``, ``send_task(...).get()``,
``GroupResult.restore(id)``, ``.state``/``.info``/``.traceback``/``.date_done``, from any
process. It is no second store: a read is one primary-key select per run table (and, for a
failure, the failed attempt's event; for a workflow step's success, what it sent, Celery's
``children``: journal/step_children.py), and the only writes are ``update_state``'s progress
(fenced by the attempt's claim, see ``progress``) and ``forget``. What Celery's worker
would store after a task (SUCCESS, FAILURE, RETRY, ...) the journal already holds, so
``store_result`` of those states writes nothing.

A task id is read as ``AsyncResult`` callers hold it: the caller's own id or the job id
(``message.job_id_of_task``), never an attempt's; an id no run table knows is
``PENDING``, as Celery answers for an id it has never seen.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from celery import Celery, states
from celery.backends.base import BaseBackend
from celery.exceptions import ChordError, TaskRevokedError, WorkerLostError
from celery.exceptions import TimeoutError as CeleryTimeoutError
from sqlalchemy import Connection

from jobsapp.db import get_engine
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.celery_api import revoke
from jobsapp.lifecycle.journal import Run, step_children, workflow
from jobsapp.lifecycle.journal.kept_result import CHILDREN
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.schema_checked import SchemaChecked
from jobsapp.lifecycle.journal.workflow import Blocked
from jobsapp.lifecycle.rules.message import job_id_of_task
from jobsapp.lifecycle.rules.results import decoded, progress_of, replaced_by
from jobsapp.lifecycle.rules.states import Outcome, State

NAME = "jobsapp.lifecycle.celery_api.backend:JournalBackend"


_REVOKED = (Outcome.CANCELLED.value, Outcome.EXPIRED.value)
_WORKER_LOST = (Outcome.STALE.value,)

# What a result is read from: a run row, or a blocked step's stand-in (no run table).
Answer = Run | Blocked


class JobFailed(Exception):
    """A failed job with no exception of its body to raise (skipped, or ended by the
    journal before its body ran); ``outcome`` says why."""

    def __init__(self, job_id: Any, outcome: str | None, error: str | None) -> None:
        super().__init__(f"job {job_id} failed ({outcome}): {error}")
        self.job_id, self.outcome, self.error = job_id, outcome, error


def celery_state(row: Answer | None) -> str:
    """The journal row's state in Celery's names, as ``AsyncResult.state`` would say it.

    No row is ``PENDING`` (Celery's answer for an id it does not know); a queued job is
    ``PENDING`` before its first attempt and ``RETRY`` after one; a running one is
    ``STARTED`` (or the state its body last gave ``update_state``); a cancelled or expired
    one is ``REVOKED`` (Celery's state for both); every other failure (exhausted,
    permanent, stale, skipped, ...) is ``FAILURE``, its journal outcome saying which.
    """
    if row is None:
        return states.PENDING
    state = row.state
    if state == State.QUEUED.value:
        return states.RETRY if row.attempts else states.PENDING
    if state == State.RUNNING.value:
        shown = progress_of(row.result, row.attempts)
        return states.STARTED if shown is None else str(shown["state"])
    if state == State.SUCCEEDED.value:
        return states.SUCCESS
    return states.REVOKED if row.outcome in _REVOKED else states.FAILURE


def find(conn: Connection, job_id: uuid.UUID) -> tuple[RunTable | None, Answer | None]:
    """The run table and run of ``job_id``; a workflow step that will not run (what it
    waited for failed) as its ``Blocked`` stand-in, with no table; (None, None) when none
    knows it."""
    found = journal.locate(conn, job_id)
    return found if found is not None else (None, workflow.blocked(conn, job_id))


class JournalBackend(BaseBackend):
    """Celery's results of lifecycle jobs, read from (and never copied out of) the journal."""

    app: Celery

    # update_state and forget write the run rows; nothing here expires by itself.
    persistent = True
    supports_native_join = False

    def __init__(self, app: Celery, url: str | None = None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.url = url
        # (task, the run's queue) -> (the router that routed it, its routing key).
        self._routed: dict[tuple[str, str | None], tuple[Any, str | None]] = {}

    def as_uri(self, include_password: bool = False) -> str:
        del include_password
        return NAME

    def wait_for_pending(
        self,
        result: Any,
        timeout: float | None = None,
        interval: float = 0.5,
        no_ack: bool = True,
        on_message: Callable[[dict[str, Any]], Any] | None = None,
        on_interval: Callable[[], Any] | None = None,
        callback: Any = None,
        propagate: bool = True,
    ) -> Any:
        """Celery's ``get()``; with ``on_message`` (Celery's progress idiom, which its
        Redis backend feeds from the states a task publishes) each state the run shows
        is handed on once, as it is read from the journal every ``interval``."""
        if on_message is None:
            return super().wait_for_pending(
                result, timeout, interval, no_ack, None, on_interval, callback, propagate
            )
        self._ensure_not_eager()  # type: ignore[attr-defined]  # Celery's SyncBackendMixin
        meta = self._watched(str(result.id), timeout, interval, on_message, on_interval)
        result._maybe_set_cache(meta)
        return result.maybe_throw(propagate=propagate, callback=callback)

    def _watched(
        self,
        task_id: str,
        timeout: float | None,
        interval: float,
        on_message: Callable[[dict[str, Any]], Any],
        on_interval: Callable[[], Any] | None,
    ) -> dict[str, Any]:
        """The run's meta once it is ready, each new state before it told to ``on_message``
        (a pending run publishes none in Celery)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        told: tuple[str, str] | None = None
        while True:
            meta = self.get_task_meta(task_id)
            shown = (meta["status"], repr(meta.get("result")))
            if shown != told and meta["status"] != states.PENDING:
                told = shown
                on_message(meta)
            if meta["status"] in states.READY_STATES:
                return meta
            _next_read(deadline, interval, on_interval)

    def get_many(
        self,
        task_ids: Iterable[str],
        timeout: float | None = None,
        interval: float = 0.5,
        no_ack: bool = True,
        on_message: Callable[[dict[str, Any]], Any] | None = None,
        on_interval: Callable[[], Any] | None = None,
        max_iterations: int | None = None,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Celery's ``join_native``: each run's meta once it is ready, read every
        ``interval`` (as its key-value backends read theirs)."""
        del no_ack
        waiting = list(dict.fromkeys(str(task_id) for task_id in task_ids))
        deadline = None if timeout is None else time.monotonic() + timeout
        rounds = 0
        while waiting:
            for task_id in list(waiting):
                meta = self.get_task_meta(task_id)
                if meta["status"] in states.READY_STATES:
                    waiting.remove(task_id)
                    if on_message is not None:
                        on_message(meta)
                    yield task_id, meta
            rounds += 1
            if not waiting or (max_iterations and rounds >= max_iterations):
                return
            _next_read(deadline, interval, on_interval)

    def _get_task_meta_for(self, task_id: str) -> dict[str, Any]:
        with SchemaChecked(), get_engine().connect() as conn:
            spec, row = find(conn, job_id_of_task(str(task_id)))
            return self.meta_of(conn, str(task_id), spec, row)

    def meta_of(
        self,
        conn: Connection,
        task_id: str,
        spec: RunTable | None,
        row: Answer | None,
    ) -> dict[str, Any]:
        """Celery's task meta (state, result, traceback, date_done) of a run row; a run
        that handed its answer to another job (``Task.replace``) answers as that job."""
        spec, row = _replacement(conn, spec, row)
        status = celery_state(row)
        if row is not None and status == states.STARTED and not self._tracks_started(row):
            status = states.PENDING  # Celery's answer for a running task it does not track
        meta: dict[str, Any] = {
            "task_id": task_id,
            "status": status,
            "result": None,
            "traceback": None,
            "children": [],
            "date_done": None,
        }
        if row is None:
            return meta
        # Celery's extended result fields (``result_extended``), which the run holds.
        meta.update(
            name=row.task_name,
            worker=row.worker,
            retries=max(0, row.attempts - 1),
            queue=self._routed_to(row),
        )
        if spec is not None and isinstance(row, Run):
            args, meta["kwargs"], _ = row.call(spec)
            meta["args"] = list(args)
        if status == states.SUCCESS:
            meta["result"] = decoded(row.result)
            meta["children"] = _children(conn, spec, row)
        elif status in states.EXCEPTION_STATES:
            meta["result"], meta["traceback"] = self._failure(conn, spec, row)
        elif (shown := progress_of(row.result, row.attempts)) is not None:
            meta["result"] = decoded(shown["meta"])
        if status in states.READY_STATES:
            meta["date_done"] = row.finished_at
        return meta

    def _routed_to(self, row: Answer) -> str | None:
        """The routing key the run's messages went with: its queue's, as Celery's router
        routes it (the row keeps a queue only when the call named one). Routed once per
        task and queue while the app keeps its router (its routes are read once, into it):
        a ``get()`` reads the meta at every poll."""
        router = self.app.amqp.router
        kept = self._routed.get((row.task_name, row.queue))
        if kept is None or kept[0] is not router:
            options = {"queue": row.queue} if row.queue else {}
            queue = router.route(options, row.task_name).get("queue")
            key = getattr(queue, "routing_key", None) or getattr(queue, "name", None)
            kept = self._routed[row.task_name, row.queue] = (router, key)
        routing_key: str | None = kept[1]
        return routing_key

    def _tracks_started(self, row: Answer) -> bool:
        """Celery says ``STARTED`` only for a task with ``track_started`` (the task's own,
        else ``task_track_started``); the journal knows either way."""
        task = self.app.tasks.get(row.task_name)
        tracked = getattr(task, "track_started", None)
        return bool(self.app.conf.task_track_started if tracked is None else tracked)

    def _failure(
        self, conn: Connection, spec: RunTable | None, row: Answer
    ) -> tuple[BaseException | None, str | None]:
        """The exception ``get()`` raises for a failed row, and its traceback: the body's
        own (rebuilt as Celery rebuilds a stored one), Celery's for a revoke or a lost
        worker, else ``JobFailed``; each carries ``job_id`` and ``outcome``. A queued run
        after an attempt (``RETRY``) shows that attempt's exception, if it raised one."""
        if spec is None:
            return self._blocked(conn, row), None
        failure = journal.attempt_failure(conn, spec, row.job_id, row.attempts)
        if failure is not None and row.outcome not in _REVOKED:
            given = failure.args if failure.args is not None else [failure.message]
            exc, tb = self._rebuilt(failure.type, given), failure.traceback
        elif row.state == State.QUEUED.value:
            return None, None
        else:
            exc, tb = _without_body(row), None
        _note(exc, row)
        return exc, tb

    def _blocked(self, conn: Connection, row: Answer) -> BaseException:
        """A step that will not run raises what Celery's chain raises: the exception of the
        step it waited for (``ChordError`` naming it, for a chord's body)."""
        if row.outcome in (workflow.UPSTREAM_FAILED, workflow.CHORD_FAILED):
            for upstream in workflow.waited_on(conn, row.job_id):
                spec, up = find(conn, uuid.UUID(upstream))
                if up is not None and celery_state(up) in states.EXCEPTION_STATES:
                    exc, _ = self._failure(conn, spec, up)
                    if exc is not None and row.outcome == workflow.UPSTREAM_FAILED:
                        return exc
                    if exc is not None:
                        return ChordError(f"Dependency {upstream} raised {exc!r}")
        exc = _without_body(row)
        _note(exc, row)
        return exc

    def _rebuilt(self, qualified: str, args: list[Any]) -> BaseException:
        """``module.Qualname(*args)`` through Celery's own (checked) rebuild; a class not
        loaded in this process comes back as a stand-in of the same name, as in Celery."""
        module, _, name = qualified.rpartition(".")
        while module and module not in sys.modules and "." in module:
            # A nested class: its module is the longest loaded prefix.
            module, _, outer = module.rpartition(".")
            name = f"{outer}.{name}"
        stored = {"exc_type": name or qualified, "exc_module": module or None, "exc_message": args}
        rebuilt: BaseException = self.exception_to_python(stored)
        return rebuilt

    def store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: Any = None,
        request: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Nothing to store: the journal recorded the run's own end (and update_state of a
        lifecycle run writes through ``LifecycleTask.update_state``)."""
        del task_id, state, traceback, request, kwargs
        return result

    def mark_as_revoked(
        self,
        task_id: str,
        reason: str = "",
        request: Any = None,
        store_result: bool = True,
        state: str = states.REVOKED,
    ) -> None:
        """Celery's worker discarded a message its revoked list names: the run waiting for
        that attempt is cancelled in the journal (``revoke.worker_discarded``). An expired
        message is the journal's expiry pass's; a terminated attempt, the worker's parent's
        (``celery_view``)."""
        del store_result, state
        if reason not in {"expired", "terminated"}:
            revoke.worker_discarded(self.app, str(task_id), request)

    def _forget(self, task_id: str) -> None:
        """Celery's ``forget``: drop the kept return value; the run itself stays in the
        journal (its state and history are the audit trail)."""
        with SchemaChecked(), get_engine().begin() as conn:
            spec, row = find(conn, job_id_of_task(str(task_id)))
            if spec is not None and row is not None:
                journal.forget_result(conn, spec, row.job_id)

    def _save_group(self, group_id: str, result: Any) -> Any:
        """A lifecycle group is its workflow in the journal, already saved."""
        del group_id
        return result

    def _restore_group(self, group_id: str) -> dict[str, Any] | None:
        from jobsapp.lifecycle.celery_api import group_handles  # they build on this module

        with SchemaChecked():
            restored = group_handles.restore_group(self.app, group_id)
        return None if restored is None else {"result": restored, "date_done": None}

    def _delete_group(self, group_id: str) -> None:
        """Celery's ``GroupResult.delete``: the workflow stays, as forget's runs do."""
        del group_id


def _next_read(
    deadline: float | None, interval: float, on_interval: Callable[[], Any] | None
) -> None:
    """Wait for the next read of a run being waited for; Celery's TimeoutError past
    ``deadline`` (a monotonic time)."""
    if on_interval is not None:
        on_interval()
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        raise CeleryTimeoutError("The operation timed out.")
    time.sleep(interval if left is None else min(interval, left))


def _replacement(
    conn: Connection, spec: RunTable | None, row: Answer | None
) -> tuple[RunTable | None, Answer | None]:
    """The run that answers for ``row``: itself, or the last of the jobs it was replaced by."""
    while row is not None and row.state == State.SUCCEEDED.value:
        successor = replaced_by(row.result)
        if successor is None:
            break
        spec, row = find(conn, successor)
    return spec, row


def _children(conn: Connection, spec: RunTable | None, row: Answer) -> list[Any]:
    """What the succeeded run sent, as Celery's meta keeps it: the calls its body made
    (kept with the run at its success, read off the row), then a workflow step's next
    steps and callbacks (``step_children``); a job of its own reads nothing more."""
    if not isinstance(row, Run) or spec is None:
        return []
    # Looked up here, not in kept_children: a read of a run whose body called nothing
    # pays no Python call more.
    params = row.columns[spec.params_column] if spec.params_column else None
    made = journal.kept_children(spec, row) if params and CHILDREN in params else []
    if row.workflow_id is None:
        return made
    return made + step_children.children(conn, row.job_id, row.workflow_id)


def _without_body(row: Answer) -> BaseException:
    outcome, error = row.outcome, row.last_error
    if outcome in _REVOKED:
        return TaskRevokedError(outcome if not error else f"{outcome}: {error}")
    if outcome in _WORKER_LOST:
        return WorkerLostError(error or "the worker was lost mid-run")
    return JobFailed(row.job_id, outcome, error)


def _note(exc: BaseException, row: Answer) -> None:
    """jobsapp's detail on Celery's exception: the job and why it ended."""
    for name, value in (("job_id", row.job_id), ("outcome", row.outcome)):
        try:
            setattr(exc, name, value)
        except AttributeError:  # an exception class with __slots__ keeps only its own
            return


def for_app(app: Celery) -> JournalBackend:
    """The journal backend that answers for lifecycle jobs of ``app``: its result backend
    when that is the journal, else one of its own (a team's plain tasks keep theirs)."""
    backend = app.backend
    if isinstance(backend, JournalBackend):
        return backend
    own = app.__dict__.get("_jobsapp_journal_backend")
    if own is None:
        own = app.__dict__["_jobsapp_journal_backend"] = JournalBackend(app)
    return own
