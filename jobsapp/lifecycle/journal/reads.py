"""The journal's reads of one run; no transition, no write.

``load`` (lifecycle/celery_api/handle.py, lifecycle/task.py, lifecycle/worker/claim.py,
operator.py), ``locate`` (an id's run in any run table: lifecycle/celery_api/backend.py,
lifecycle/transport/unregistered.py), ``load_with_clock`` (lifecycle/worker/claim.py, to
explain a refused claim), ``attempt_failure`` (lifecycle/celery_api/handle.py, Celery's
``traceback``), ``snoozes`` (lifecycle/worker/attempt.py, the limit of Transition.SNOOZE),
``active_holder`` (the run holding a concurrency key: enqueue_one.py, reopen.py, and
lifecycle/worker/claim.py's Transition.SKIP), ``step_runs`` (the run rows of workflow
steps: workflow.py, finished_counts.py, step_children.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select

from jobsapp.db import utcnow
from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.journal._sql import EVENTS, _first
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.run import RecordedFailure, Run
from jobsapp.lifecycle.rules.states import ACTIVE_STATES, State, Transition


def load(conn: Connection, spec: RunTable, job_id: uuid.UUID) -> Run | None:
    table = spec.table
    return Run.maybe(_first(conn, select(table).where(table.c.job_id == job_id)))


def locate(conn: Connection, job_id: uuid.UUID) -> tuple[RunTable, Run] | None:
    """The run of ``job_id`` and its table, whichever run table of this process holds it."""
    for spec in registry.all_tables():
        run = load(conn, spec, job_id)
        if run is not None:
            return spec, run
    return None


def snoozes(conn: Connection, spec: RunTable, job_id: uuid.UUID) -> int:
    """Long Retry-After pauses since the job was last (re)started: its ``snooze`` events
    from the attempt its last rerun or replay opened (derived, no counter column)."""
    mine = (EVENTS.c.module == spec.module, EVENTS.c.job_id == job_id)
    reopened = select(func.coalesce(func.max(EVENTS.c.attempt), 0)).where(
        *mine, EVENTS.c.transition.in_((Transition.RERUN.value, Transition.REPLAY.value))
    )
    stmt = select(func.count()).where(
        *mine,
        EVENTS.c.transition == Transition.SNOOZE.value,
        EVENTS.c.attempt >= reopened.scalar_subquery(),
    )
    return int(conn.execute(stmt).scalar_one())


def load_with_clock(
    conn: Connection, spec: RunTable, job_id: uuid.UUID
) -> tuple[Run | None, datetime]:
    """The row and the database's clock, read in one statement."""
    if conn.dialect.name != "postgresql":
        return load(conn, spec, job_id), utcnow()
    table = spec.table
    stmt = select(table, func.now().label("_db_now")).where(table.c.job_id == job_id)
    row = _first(conn, stmt)
    if row is None:
        return None, utcnow()  # no row: nothing to time
    db_now = row.pop("_db_now")
    return Run.from_row(row), db_now


def attempt_failure(
    conn: Connection, spec: RunTable, job_id: uuid.UUID, attempt: int
) -> RecordedFailure | None:
    """The failure detail (type, message, traceback) an event of ``attempt`` recorded, the
    latest if several did; None when none did (a reaped or cancelled run)."""
    stmt = (
        select(EVENTS.c.detail)
        .where(
            EVENTS.c.module == spec.module,
            EVENTS.c.job_id == job_id,
            EVENTS.c.attempt == attempt,
            EVENTS.c.detail.is_not(None),
        )
        .order_by(EVENTS.c.id.desc())
        .limit(1)
    )
    found = conn.execute(stmt).scalar()
    return RecordedFailure.of(found) if isinstance(found, Mapping) else None


def active_holder(conn: Connection, spec: RunTable, key: str) -> uuid.UUID | None:
    table = spec.table
    stmt = select(table.c.job_id).where(
        table.c.concurrency_key == key, table.c.state.in_(ACTIVE_STATES)
    )
    found = conn.execute(stmt).scalar()
    return found if isinstance(found, uuid.UUID) else None


def step_runs(
    conn: Connection,
    steps: Iterable[Mapping[str, Any]],
    *columns: str,
    state: State | None = None,
) -> dict[uuid.UUID, Any]:
    """The run rows (``job_id`` and ``columns``) of those of ``steps`` that have one (in
    ``state``, if given), by job id: one SELECT per run table the steps' modules name."""
    by_module: dict[str, list[uuid.UUID]] = {}
    for step in steps:
        by_module.setdefault(step["module"], []).append(step["job_id"])
    found: dict[uuid.UUID, Any] = {}
    for module, job_ids in by_module.items():
        table = registry.get(module).table
        stmt = select(table.c.job_id, *(table.c[c] for c in columns))
        stmt = stmt.where(table.c.job_id.in_(job_ids))
        if state is not None:
            stmt = stmt.where(table.c.state == state.value)
        found |= {row.job_id: row for row in conn.execute(stmt)}
    return found
