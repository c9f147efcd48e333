"""Transition.CLAIM: queued -> running (``claim``), or none -> running for a foreign
producer's message that has no row (``claim_by_insert``).

Called by lifecycle/worker/claim.py, which explains a refused claim (reads.py) and journals
Transition.SKIP (events.py) when a held concurrency key refuses the insert.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Connection

from jobsapp.lifecycle.journal import hot
from jobsapp.lifecycle.journal.clock import _stamp
from jobsapp.lifecycle.journal.events import Event
from jobsapp.lifecycle.journal.new_run import NewJob, _insert_params, _new_row, new_claim_token
from jobsapp.lifecycle.journal.plans import _insert_plan, _run
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.run import Run
from jobsapp.lifecycle.rules.states import State, Transition


def claim(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    attempt: int,
    *,
    worker: str,
    now: datetime | None = None,
) -> Run | None:
    """queued -> running, only for the next attempt and only once it is due; the row
    returned carries the claim's ``claim_token``, which every later write must name."""
    now = _stamp(conn, now)
    params = {
        "r_job_id": job_id,
        "r_previous": attempt - 1,
        "r_attempts": attempt,
        "r_now": now,
        "r_worker": worker,
        "r_claim_token": new_claim_token(),
    }
    event = Event(spec, attempt, Transition.CLAIM, State.QUEUED, State.RUNNING, worker, now)
    return Run.maybe(_run(conn, hot.claim(spec, conn.dialect.name), params, event, None)[0])


def claim_by_insert(
    conn: Connection, job: NewJob, attempt: int, *, worker: str, now: datetime | None = None
) -> Run | None:
    """A foreign producer's message (no row): insert the run as running under the index.
    Not for a limited key's run, which takes a slot first (enqueue, then ``claim``)."""
    if job.key_limit is not None:
        raise ValueError(f"{job.task_name}: a limited key's run joins its key's line first")
    now = _stamp(conn, now)
    row = {**_new_row(job, now, State.RUNNING, attempt), "worker": worker}
    plan = _insert_plan(job.spec, conn.dialect.name, State.RUNNING)
    event = Event(
        job.spec,
        attempt,
        Transition.CLAIM,
        None,
        State.RUNNING,
        worker,
        now,
        reason="claimed by insert: message from a producer without a journal row",
    )
    return Run.maybe(_run(conn, plan, _insert_params(row, now, job), event, None)[0])
