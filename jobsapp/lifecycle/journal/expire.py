"""Transition.EXPIRE: queued -> failed/expired, once the run's ``expires_at`` has passed.

Two writers: lifecycle/worker/claim.py, when the claim of a delivered message was refused on an
expired row (``expire``), and the reaper (maintenance/reaper.py, ``expire_due``), for a
run whose message never came, so that it does not wait in ``queued`` forever. A workflow
step's expiry blocks what waited for it (workflow.cancelled), as Celery's worker marks an
expired message revoked, failing a chord it is a member of.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import ColumnElement, Connection, select, update

from jobsapp.lifecycle.journal import workflow
from jobsapp.lifecycle.journal._sql import _require_transaction
from jobsapp.lifecycle.journal.clock import clock
from jobsapp.lifecycle.journal.events import record_event
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.run import Run
from jobsapp.lifecycle.rules.states import Outcome, State, Transition

REASON = "expired before a worker started it"


def expire(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    *,
    actor: str,
    now: datetime | None = None,
) -> bool:
    """The one run ``job_id``, if still queued and past its expiry."""
    return bool(_expire(conn, spec, spec.table.c.job_id == job_id, actor=actor, now=now))


def expire_due(
    conn: Connection, spec: RunTable, *, limit: int, actor: str, now: datetime | None = None
) -> int:
    """Up to ``limit`` queued runs past their expiry (rows another writer holds are left
    for the next pass); how many were expired."""
    table = spec.table
    due = (
        select(table.c.job_id)
        .where(table.c.state == State.QUEUED.value, table.c.expires_at <= clock(conn, now))
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return len(_expire(conn, spec, table.c.job_id.in_(due.scalar_subquery()), actor=actor, now=now))


def _expire(
    conn: Connection,
    spec: RunTable,
    which: ColumnElement[bool],
    *,
    actor: str,
    now: datetime | None,
) -> list[Run]:
    _require_transaction(conn, "expire")
    table = spec.table
    at = clock(conn, now)
    stmt = (
        update(table)
        .where(which, table.c.state == State.QUEUED.value, table.c.expires_at <= at)
        .values(
            state=State.FAILED.value,
            outcome=Outcome.EXPIRED.value,
            finished_at=at,
            updated_at=at,
            next_retry_at=None,
            last_error=REASON,
        )
        .returning(*table.c)
    )
    runs = [Run.from_row(dict(r)) for r in conn.execute(stmt).mappings()]
    for run in runs:
        record_event(
            conn,
            spec,
            run.job_id,
            run.attempts + 1,
            Transition.EXPIRE,
            from_state=State.QUEUED,
            to_state=State.FAILED,
            actor=actor,
            now=run.updated_at,
            reason=REASON,
        )
        if run.workflow_id is not None:
            workflow.cancelled(conn, run.job_id, actor=actor, now=run.updated_at, how="expired")
    spec.changed(conn, Transition.EXPIRE, [run.columns for run in runs])
    return runs
