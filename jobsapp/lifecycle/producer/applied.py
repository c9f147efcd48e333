"""``LifecycleTask.apply_async`` of a job of its own (no ``link``/``link_error``, not eager):
the Celery options a lifecycle task refuses, and the enqueue of one call."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from celery import Celery
from kombu import Connection as KombuConnection
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from jobsapp.db import get_engine
from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.journal import EnqueueOutcome, NewJob, totals
from jobsapp.lifecycle.producer import enqueue, newjob

# Celery options a lifecycle task cannot honour, and what to do instead.
_UNSUPPORTED = {
    "exchange": "pass queue=, or route the task with task_routes",
    "routing_key": "pass queue=, or route the task with task_routes",
    "serializer": "a job's arguments are kept as JSON (kombu's): only serializer='json'",
}


# Celery options that change nothing of what a lifecycle job keeps or sends: a job's
# arguments are JSON in the journal, its message is a small envelope, its value is kept
# whatever ignore_result says (docs/celery-compat.md), and the outbox publishes every
# message until the broker takes it, whatever retry says; add_to_parent is read by
# LifecycleTask.apply_async (a call from a body joins its children unless it is False);
# reply_to (set by a signature's freeze()) names where Celery's RPC backend would send the
# value, which the journal keeps instead; a producer (Celery's way to publish many on one
# connection) is jobsapp's publisher's to choose, after the journal's COMMIT.
_WITHOUT_EFFECT = frozenset(
    {
        "add_to_parent",
        "compression",
        "ignore_result",
        "producer",
        "reply_to",
        "retry",
        "retry_policy",
    }
)


def given_lineage(options: dict[str, Any]) -> newjob.GivenLineage | None:
    """The call's own ``root_id`` and ``parent_id``, taken out of ``options`` (Celery's
    tracer sends a ``link`` callback with both, ``send_task`` takes them from anyone)."""
    root, parent = options.pop("root_id", None), options.pop("parent_id", None)
    if root is None and parent is None:
        return None
    return (None if root is None else str(root)), (None if parent is None else str(parent))


def unsupported(options: Mapping[str, Any]) -> set[str]:
    """The options of a call a lifecycle task cannot honour (``refuse`` names them)."""
    return {
        name
        for name, value in options.items()
        if name not in _WITHOUT_EFFECT and not (name == "serializer" and value == "json")
    }


def journal_connection(name: str, given: Any) -> Connection | None:
    """``apply_async(connection=...)`` that is not SQLAlchemy's (the transaction a job joins):
    Celery's own broker connection (``app.pool.acquire()``), taken as ``producer`` is, or
    a one-line ``TypeError``."""
    if isinstance(given, KombuConnection):
        return None
    raise TypeError(
        f"{name}.apply_async: connection= takes a SQLAlchemy Connection (the enqueue joins "
        f"its transaction) or Celery's broker connection, not {type(given).__name__}"
    )


def refuse(name: str, options: Collection[str]) -> None:
    """A one-line ``TypeError`` naming each option ``name.apply_async`` cannot honour."""
    if not options:
        return
    hints = "; ".join(f"{o}: {_UNSUPPORTED.get(o, 'not supported')}" for o in sorted(options))
    raise TypeError(f"{name}.apply_async: jobsapp does not support {sorted(options)} ({hints})")


def enqueued(
    app: Celery,
    job: NewJob,
    *,
    task_id: str | None,
    session: Session | None,
    connection: Connection | None,
    **schedule: Any,
) -> JobHandle:
    """``job`` with ``apply_async``'s ``schedule`` options (``newjob.scheduled``), enqueued
    through the journal (idempotent by job id) and published after COMMIT; ``task_id``,
    the caller's own id, names its result as in Celery."""
    handle = enqueue.enqueue(
        app, newjob.scheduled(job, **schedule), session=session, connection=connection
    )
    if handle.outcome is EnqueueOutcome.DUPLICATE:
        totals.count_dedup_hit(get_engine(), job.spec.module, job.task_name)
    if task_id:
        handle.id = task_id
    return handle
