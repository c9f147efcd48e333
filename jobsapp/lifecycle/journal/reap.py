"""The reaper's queries: Transition.REAP_REQUEUE and Transition.REAP_FAIL.

A running run whose heartbeat is stale goes back to queued (with its next message) or to
failed/stale, as its run table's policy says; one a revoke asked to stop ends
failed/cancelled, recorded as Transition.CANCEL (its worker died or is stuck in a call
before it could honour the request); a workflow step failed so starts its errbacks and
blocks what waited for it, one cancelled only blocks it (workflow.py). ``find_stale``
reads and locks a batch; ``reap`` writes it in one guarded statement (both named in
hot.py). Called by
maintenance/reaper.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from jobsapp.lifecycle.journal import hot, key_slots, workflow
from jobsapp.lifecycle.journal.events import record_event, record_kept_claim
from jobsapp.lifecycle.journal.outbox_rows import add_outbox
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.run import EndedAttempt
from jobsapp.lifecycle.rules.message import TIME_LIMITS
from jobsapp.lifecycle.rules.states import State, Transition


@dataclass(frozen=True)
class StaleRun:
    job_id: uuid.UUID
    attempt: int
    rescues: int
    max_attempts: int
    task_name: str
    ids: Mapping[str, Any]
    queue: str | None = None
    cancel_requested: bool = False
    priority: int | None = None
    limits: Mapping[str, float | None] = field(default_factory=dict)


def find_stale(
    conn: Connection,
    spec: RunTable,
    *,
    cutoff: datetime,
    limit: int,
    skip: Collection[uuid.UUID] = (),
) -> list[StaleRun]:
    """Running rows whose heartbeat is older than ``cutoff``, oldest first, locked.

    ``skip`` names runs this pass already found blocked, so they do not fill every batch.
    """
    stmt = hot.stale_runs(spec, cutoff=cutoff, limit=limit, skip=skip)
    return [
        StaleRun(
            job_id=r["job_id"],
            attempt=r["attempts"],
            rescues=r["rescues"],
            max_attempts=r["max_attempts"],
            task_name=r["task_name"],
            ids=spec.ids_from_row(dict(r)),
            queue=r["queue"],
            cancel_requested=r["cancel_requested_at"] is not None,
            priority=r["priority"],
            limits={k: r[k] for k in TIME_LIMITS},
        )
        for r in conn.execute(stmt).mappings()
    ]


def reap(
    conn: Connection,
    spec: RunTable,
    runs: Sequence[StaleRun],
    *,
    requeue_them: bool,
    cutoff: datetime,
    reason: str,
    now: datetime,
) -> list[StaleRun]:
    """One batched, guarded write: still running, same attempt, heartbeat still stale; each
    reaped attempt's claim its row carried becomes an event row before the reap's."""
    if not runs:
        return []
    keys = [(r.job_id, r.attempt) for r in runs]
    stmt = hot.reap(spec, keys, requeue_them=requeue_them, cutoff=cutoff, reason=reason, now=now)
    ended = [EndedAttempt.of(row) for row in conn.execute(stmt).mappings()]
    done = {attempt.job_id: attempt for attempt in ended}
    reaped = [r for r in runs if r.job_id in done]
    for run in reaped:
        record_kept_claim(conn, spec, done[run.job_id])
    _after_reap(conn, spec, reaped, requeued=requeue_them, reason=reason, now=now)
    if not requeue_them:
        for run in reaped:
            if done[run.job_id].workflow_id is not None:
                _step_ended(conn, run, reason, now)
    return reaped


def _step_ended(conn: Connection, run: StaleRun, reason: str, now: datetime) -> None:
    """A workflow step ended for good, as its worker's end would have written it: a revoked
    one cancelled (no errbacks), any other failed (its errbacks); the relay publishes what
    either starts."""
    if run.cancel_requested:
        workflow.cancelled(conn, run.job_id, actor="reaper", now=now)
    else:
        workflow.failed(conn, run.job_id, reason, actor="reaper", now=now)


def _after_reap(
    conn: Connection,
    spec: RunTable,
    reaped: Sequence[StaleRun],
    *,
    requeued: bool,
    reason: str,
    now: datetime,
) -> None:
    to_state = State.QUEUED if requeued else State.FAILED
    moved: dict[Transition, list[StaleRun]] = {}
    for run in reaped:
        transition = ended_by(run, requeued=requeued)
        moved.setdefault(transition, []).append(run)
        record_event(
            conn,
            spec,
            run.job_id,
            run.attempt,
            transition,
            from_state=State.RUNNING,
            to_state=to_state,
            actor="reaper",
            now=now,
            reason=reason,
        )
        if requeued:
            row = {
                "job_id": run.job_id,
                "task_name": run.task_name,
                "queue": run.queue,
                "priority": run.priority,
                **run.limits,
                **run.ids,
            }
            add_outbox(conn, spec, row, attempt=run.attempt + 1, now=now, available_at=now)
        else:
            # A limited key's slot goes with the run; the relay publishes the waiter granted.
            key_slots.release(conn, spec, run.job_id, now=now)
    for transition, runs in moved.items():
        spec.changed(conn, transition, [{"job_id": r.job_id, **r.ids} for r in runs])


def ended_by(run: StaleRun, *, requeued: bool) -> Transition:
    """The transition a reap of ``run`` records: a run a revoke asked to stop ends
    cancelled (the row's outcome), as its worker would have ended it, not stale; its
    history, metrics and domain row then say so too. ``cancel_requested`` was read with
    the row locked, so it is what the reap's outcome ``CASE`` sees."""
    if requeued:
        return Transition.REAP_REQUEUE
    return Transition.CANCEL if run.cancel_requested else Transition.REAP_FAIL
