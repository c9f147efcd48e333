"""The outbox row a transition writes for the attempt it schedules.

``Outgoing`` (built by ``outgoing``) is the row a prebuilt plan (plans.py) inserts in the
transition's own statement: Transition.ENQUEUE (enqueue_one.py, enqueue_many.py), RETRY and
SNOOZE (finish.py). ``add_outbox`` writes (or re-arms) it after a statement built per call:
reopen.py (Transition.RERUN, REPLAY), reap.py (Transition.REAP_REQUEUE), and
maintenance/relay.py's repair of a queued run that has no message. ``PendingMessage`` is a
row on its way to the broker (lifecycle/transport/outbox.py publishes it);
``on_local_clock`` dates it
for a fast-path publish (lifecycle/producer/enqueue.py, lifecycle/worker/attempt.py, operator.py).
Everything that happens to the row afterwards is lifecycle/journal/outbox_queries.py's, but an
operator's moves (run_now.py, revive.py); ``pending_rows`` reads rows back as messages.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, RowMapping

from jobsapp.db import utcnow
from jobsapp.lifecycle.journal._sql import OUTBOX, upsert
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules.message import TIME_LIMITS, build_body

# The key of a run's parameters that holds its body's lineage (journal/workflow.py's
# ``body_lineage``, a call from a task's body): a first attempt's headers carry it.
LINEAGE = "lineage"
# The key of a call's run parameters that holds its display name (``apply_async(shadow=)``):
# every attempt's message carries it in Celery's ``shadow`` header.
SHADOW = "shadow"


@dataclass(frozen=True)
class PendingMessage:
    """An outbox row on its way to the broker."""

    id: int
    job_id: uuid.UUID
    attempt: int
    task_name: str
    body: Mapping[str, Any]
    available_at: datetime
    publish_count: int = 0
    publish_failures: int = 0
    queue: str | None = None
    priority: int | None = None
    # The root and parent its job keeps (a call from a task's body, a canvas step), which
    # a publisher outside that task puts in the first attempt's headers: the relay reads
    # them (outbox_queries.with_kept_headers), the caller's fast path takes the ones its
    # call named (``NewJob.lineage``); None when the run keeps none (a root of None: the
    # message's own task id, as in Celery).
    lineage: tuple[str | None, str | None] | None = None
    # The call's display name its run keeps (``SHADOW``), in every attempt's ``shadow``
    # header: read with the row a transition writes it from, or by the relay.
    shadow: str | None = None

    @classmethod
    def of_row(cls, r: Mapping[Any, Any]) -> PendingMessage:
        """The message of an outbox row, read with all its columns."""
        return cls(
            r["id"],
            r["job_id"],
            r["attempt"],
            r["task_name"],
            r["body"],
            r["available_at"],
            r["publish_count"],
            r["publish_failures"],
            queue=r["queue"],
            priority=r["priority"],
        )


def pending_rows(rows: Iterable[RowMapping]) -> list[PendingMessage]:
    """Outbox rows as read back (``RETURNING *`` or a SELECT), as messages to publish."""
    return [PendingMessage.of_row(r) for r in rows]


def on_local_clock(
    message: PendingMessage, due_in: timedelta, now: datetime | None = None
) -> PendingMessage:
    """``message`` for this process's fast path, due ``due_in`` from ``now`` (a reading of
    this process's clock; read here if not given): the broker countdown is counted on it,
    never against the database's."""
    return replace(message, available_at=(now or utcnow()) + due_in)


def add_outbox(
    conn: Connection,
    spec: RunTable,
    row: Mapping[str, Any],
    *,
    attempt: int,
    now: datetime,
    available_at: datetime,
) -> PendingMessage:
    """The message that starts ``attempt`` of the run in ``row``; published when due.

    An attempt that never started (cancelled while queued, then replayed) already has a
    row: it is re-armed as a fresh row, live again even if the relay had given it up, so
    the relay publishes it and any old copy still in the broker claims the same attempt.
    """
    out = outgoing(spec, row, attempt=attempt, now=now, available_at=available_at)
    values = out.values(spec.module)
    stmt = upsert(conn, OUTBOX).values(values)
    rearm = {
        "body": values["body"],
        "created_at": now,
        "available_at": available_at,
        "published_at": None,
        "delivered_at": None,
        "publish_count": 0,
        "publish_failures": 0,
        "last_error": None,
        "dead_at": None,
        "queue": values["queue"],
        "priority": values["priority"],
    }
    rearmed = stmt.on_conflict_do_update(
        index_elements=[OUTBOX.c.module, OUTBOX.c.job_id, OUTBOX.c.attempt], set_=rearm
    ).returning(OUTBOX.c.id)
    return out.pending(int(conn.execute(rearmed).scalar_one()), available_at)


@dataclass(frozen=True)
class Outgoing:
    """The outbox row a transition writes for the attempt it schedules."""

    job_id: uuid.UUID
    attempt: int
    task_name: str
    body: Mapping[str, Any]
    now: datetime | None  # None: the statement takes the database's clock
    available_at: datetime | None
    queue: str | None = None
    priority: int | None = None
    shadow: str | None = None
    lineage: tuple[str | None, str | None] | None = None

    def values(self, module: str) -> dict[str, Any]:
        return {
            "module": module,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "task_name": self.task_name,
            "body": dict(self.body),
            "created_at": self.now,
            "available_at": self.available_at,
            "queue": self.queue,
            "priority": self.priority or 0,
        }

    def pending(self, outbox_id: int, available_at: datetime) -> PendingMessage:
        return PendingMessage(
            outbox_id,
            self.job_id,
            self.attempt,
            self.task_name,
            self.body,
            available_at,
            queue=self.queue,
            priority=self.priority,
            shadow=self.shadow,
            lineage=self.lineage,
        )


def outgoing(
    spec: RunTable,
    row: Mapping[str, Any],
    *,
    attempt: int,
    now: datetime | None,
    available_at: datetime | None,
    traceparent: str | None = None,
    lineage: tuple[str | None, str | None] | None = None,
) -> Outgoing:
    # The body's enqueued_at is informational (nothing compares it): the process clock.
    body = build_body(
        job_id=row["job_id"],
        module=spec.module,
        attempt=attempt,
        ids=spec.ids_from_row(row),
        enqueued_at=now or utcnow(),
        traceparent=traceparent,
        limits={k: row.get(k) for k in TIME_LIMITS},
    )
    # Every attempt goes to the queue the producer chose, at the job's priority, under the
    # call's display name, whoever writes its message.
    return Outgoing(
        row["job_id"],
        attempt,
        row["task_name"],
        body,
        now,
        available_at,
        row.get("queue"),
        row.get("priority"),
        kept_shadow(spec, row),
        lineage,
    )


def kept_shadow(spec: RunTable, row: Mapping[str, Any]) -> str | None:
    """The display name a run row keeps with its call (``SHADOW``), if the row has it."""
    column = spec.params_column
    params = row.get(column) if column is not None else None
    return params.get(SHADOW) if isinstance(params, dict) else None
