"""What a producer asks for (``NewJob``) and the run row a new job starts as.

The row is inserted queued by Transition.ENQUEUE (enqueue_one.py, enqueue_many.py) or running
by Transition.CLAIM of a foreign producer's message (claiming.py), then with a claim's token
(``new_claim_token``, which claiming.py's ``claim`` also sends). No statement of its own;
``NewJob`` is built by lifecycle/task.py, lifecycle/producer/dedup.py and attachments/reprocess.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from jobsapp.lifecycle.journal.clock import _later
from jobsapp.lifecycle.journal.plans import _prefixed
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules.states import State


@dataclass(frozen=True)
class NewJob:
    """What a producer asks for; ``values`` are the run table's own columns."""

    spec: RunTable
    job_id: uuid.UUID
    task_name: str
    concurrency_key: str
    max_attempts: int
    values: Mapping[str, Any]
    dedup_window: timedelta = timedelta(0)
    traceparent: str | None = None
    # A delayed first attempt, claimable from then on: an absolute eta (the caller's
    # clock), or a countdown counted on the database's clock.
    not_before: datetime | None = None
    delay: timedelta | None = None
    # The broker queue and Celery priority of every attempt's message (None: the app's
    # routing decides; no priority).
    queue: str | None = None
    priority: int | None = None
    # Celery's ``time_limit``/``soft_time_limit`` of the call, carried by every message.
    time_limit: float | None = None
    soft_time_limit: float | None = None
    # Celery's ``expires``, absolute (the producer's clock, as Celery counts it): an
    # attempt still queued then never runs (journal/expire.py).
    expires_at: datetime | None = None
    # The canvas this run is a step of (journal/workflow.py); None for a job of its own.
    workflow_id: uuid.UUID | None = None
    # The task's ``limit`` (or ``fair`` window) on its key: None is one active run per key
    # (the unique index); a number queues the run through the key's slots (key_slots.py).
    key_limit: int | None = None
    # The root and parent the call names itself (``apply_async(root_id=, parent_id=)``),
    # which its first message carries when the caller publishes it, as Celery's send_task
    # puts them in its headers (a relay reads them from the run: kept_headers.py).
    lineage: tuple[str | None, str | None] | None = None


def new_claim_token() -> uuid.UUID:
    """A claim's token: made here, not by the database, so the claim's statement (and its
    prepared plan) stays as it was, and unique to the claim whatever befalls the journal."""
    return uuid.uuid4()


def _new_row(
    job: NewJob,
    now: datetime | None,
    state: State,
    attempts: int,
    enqueued_by: str | None = None,
) -> dict[str, Any]:
    """``enqueued_by``: the producer of an enqueue the row carries (no event row)."""
    running = state is State.RUNNING
    return {
        "job_id": job.job_id,
        "task_name": job.task_name,
        "concurrency_key": job.concurrency_key,
        "state": str(state),  # a StrEnum's value (events.py: no ``.value`` calls)
        "attempts": attempts,
        "max_attempts": job.max_attempts,
        "rescues": 0,
        "next_retry_at": job.not_before or _later(now, job.delay),
        "started_at": now if running else None,
        "heartbeat_at": now if running else None,
        "created_at": now,
        "updated_at": now,
        "outcome": None,
        "last_error": None,
        "finished_at": None,
        "worker": None,
        "queue": job.queue,
        "claim_token": new_claim_token() if running else None,
        "result": None,
        "expires_at": job.expires_at,
        "cancel_requested_at": None,
        "workflow_id": job.workflow_id,
        "key_limit": job.key_limit,
        "enqueued_by": enqueued_by,
        "attempted_at": None,
        "priority": job.priority,
        "time_limit": job.time_limit,
        "soft_time_limit": job.soft_time_limit,
        **job.values,
    }


def _insert_params(row: Mapping[str, Any], now: datetime | None, job: NewJob) -> dict[str, Any]:
    return {**_prefixed(row, "r_"), "r_now": now, "r_delay": job.delay}
