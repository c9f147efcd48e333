"""A plain Celery call of a task no worker here registered: Celery's answer, in the journal.

Celery's worker answers a message whose ``task`` it does not know in its consumer
(``Consumer.on_unknown_task``): it logs the message, rejects it, stores ``FAILURE`` with
``NotRegistered(name)`` in the result backend, sends ``task-failed`` and fires
``task_unknown``. The journal is jobsapp's result backend, and it kept nothing for a task
it does not know: the id read ``PENDING`` for good. The guard (guard.py) asks here before
it lets Celery's handler answer, and that handler stores nothing more (the journal's
``store_result`` writes nothing).

What is written: a run in ``job_runs``, the home of tasks that declare no table (this worker
knows neither the task nor any table of its), inserted as claimed by this worker and failed
in the same transaction (Transition.CLAIM by insert, then FAIL), outcome ``unregistered``,
``NotRegistered(name)`` its failure's detail (``get()`` raises it, from any process), the
call's arguments and queue kept as an adopted plain call's. The console lists it; an
operator's replay gives it one attempt, sent to that queue: a worker whose lifecycle task
of that name keeps its runs in ``job_runs`` runs the kept call; one that knows no such
task refuses its message as below, and the relay sends it again until one does.

Refused as before (one log line, rejected, no ``FAILURE``): a message the journal already
answers for, jobsapp's own (an envelope: its producer keeps its run, queued, and the relay
sends it again until a worker that knows the task runs it, as in a rolling deploy) or a
plain call whose id a run table here holds (a copy, an id used before); a call whose
arguments the journal cannot keep (as a known task's plain call is refused); and while the
journal does not answer.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Final

from celery.exceptions import NotRegistered
from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from jobsapp.db import get_engine
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import NewJob, registry
from jobsapp.lifecycle.rules.errors import ArgumentRefused
from jobsapp.lifecycle.rules.failures import describe, failure_detail
from jobsapp.lifecycle.rules.message import is_envelope, job_id_of_task
from jobsapp.lifecycle.rules.results import stored_arguments
from jobsapp.lifecycle.rules.states import Outcome
from jobsapp.settings import get_settings

# ``job_runs``'s column for a call (tables.JobRun.params), as an adopted call keeps it.
_PARAMS: Final = "params"


def refusal(message: Any, worker: str) -> str | None:
    """None once the failure of ``message``'s call is written (Celery's handler answers
    it then); else why the guard refuses the message, as it did before. ``message`` passed
    the guard's checks: its headers and its body are Celery's protocol 2."""
    name = message.headers["task"]
    refused = f"unregistered task {name!r}"
    args, kwargs, _ = message.payload
    if is_envelope(tuple(args), kwargs):
        return refused
    try:
        job = failed_run(message.headers, args, kwargs, message.delivery_info)
    except ArgumentRefused as bad:
        return f"{refused}; its call is not kept: {bad}"
    try:
        with get_engine().begin() as conn:
            written = record(conn, job, worker)
    except SQLAlchemyError as down:
        return f"{refused}; its failure is not recorded: {type(down).__name__}"
    return None if written else refused


def failed_run(
    headers: Mapping[str, Any],
    args: list[Any],
    kwargs: Mapping[str, Any],
    delivery_info: Mapping[str, Any] | None,
) -> NewJob:
    """The run that keeps the call: its job is the task id's (``AsyncResult(id)`` reads it),
    its key its own, one attempt (the failure is the end until a replay)."""
    name = str(headers["task"])
    job_id = job_id_of_task(str(headers["id"]))
    call = {"args": list(args), "kwargs": dict(kwargs)}
    return NewJob(
        spec=registry.JOBS,
        job_id=job_id,
        task_name=name,
        concurrency_key=f"{name}:{job_id}",
        max_attempts=1,
        values={_PARAMS: stored_arguments(name, call, get_settings().args_max_bytes)},
        queue=queue_of(delivery_info or {}),
    )


def queue_of(delivery_info: Mapping[str, Any]) -> str | None:
    """The queue the message came from when its routing names it (the default exchange, or
    a queue's own direct exchange, as Celery declares its queues); None: the app's routes."""
    key, exchange = delivery_info.get("routing_key"), delivery_info.get("exchange")
    return key if isinstance(key, str) and key and exchange in ("", key) else None


def record(conn: Connection, job: NewJob, worker: str) -> bool:
    """The failed run of ``job``, in ``conn``'s transaction; False when a run table here
    already holds its id (nothing written)."""
    if journal.locate(conn, job.job_id) is not None:
        return False
    run = journal.claim_by_insert(conn, job, 1, worker=worker)
    if run is None:
        return False  # a copy of the message, written meanwhile
    return _failed(conn, job, run.claimed_token, worker)


def _failed(conn: Connection, job: NewJob, token: uuid.UUID, worker: str) -> bool:
    exc = NotRegistered(job.task_name)
    return journal.fail(
        conn,
        job.spec,
        job.job_id,
        1,
        token=token,
        outcome=Outcome.UNREGISTERED,
        error=describe(exc, ()),
        actor=worker,
        detail=failure_detail(exc, ()),
    )
