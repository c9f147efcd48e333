"""The statement compiler: the hot transitions' prebuilt plans, and ``_run``.

The hot transitions are built once per run table and dialect with bind parameters, so
each call only binds values: no statement construction, no cache-key walk. Parameter
names carry a prefix per part (r_ run row, e_ event, o_ outbox) so the parts can share
one statement.

``_insert_plan`` (Transition.ENQUEUE, and CLAIM by insert), ``_claim_plan``
(Transition.CLAIM), ``_finish_plan`` (Transition.SUCCEED, FAIL), ``_requeue_plan``
(Transition.RETRY, SNOOZE) and ``_heartbeat_stmt`` (the heartbeat) are each a ``Plan``;
``_run`` binds and runs one. Writes nothing itself: the transition modules of this package
(enqueue.py, enqueue_many.py, claim.py, heartbeat.py, finish.py) call it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    Interval,
    Table,
    bindparam,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from jobsapp.lifecycle import prepared
from jobsapp.lifecycle.journal._sql import EVENTS, OUTBOX, _first, _first_row
from jobsapp.lifecycle.journal.clock import _clock_param
from jobsapp.lifecycle.journal.events import Event
from jobsapp.lifecycle.journal.outbox_rows import Outgoing, PendingMessage
from jobsapp.lifecycle.registry import RunTable
from jobsapp.lifecycle.states import State

_EVENT_COLUMNS = ("module", "job_id", "attempt", "transition", "from_state", "to_state",
                  "actor", "reason", "at", "detail")  # fmt: skip
_OUTBOX_COLUMNS = ("module", "job_id", "attempt", "task_name", "body", "created_at",
                   "available_at", "queue", "priority")  # fmt: skip


def _bind(table: Table, column: str, prefix: str = "r_") -> Any:
    return bindparam(prefix + column, type_=table.c[column].type)


def _prefixed(values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {prefix + k: v for k, v in values.items()}


@dataclass(frozen=True)
class Plan:
    """One transition's statements: the guarded DML, then its event and outbox rows."""

    dml: Any
    event: Any
    outbox: Any | None
    combined: Any | None  # PostgreSQL: all parts as one statement


def _sequential_insert(table: Table, columns: tuple[str, ...], prefix: str) -> Any:
    return insert(table).values({c: _bind(table, c, prefix) for c in columns})


def _insert_from_changed(
    table: Table, columns: tuple[str, ...], prefix: str, derived: Mapping[str, Any]
) -> Any:
    """INSERT one row per changed run row; ``derived`` columns come from that row (its
    job_id, and its timestamps: the database's clock, read once for all parts)."""
    cols = [derived[c].label(c) if c in derived else _bind(table, c, prefix).label(c)
            for c in columns]  # fmt: skip
    return insert(table).from_select(list(columns), select(*cols))


def _available_at(row: Mapping[str, Any]) -> datetime:
    """When the message a transition wrote is due: the run's next_retry_at, else at once."""
    due = row["next_retry_at"]
    return due if isinstance(due, datetime) else row["updated_at"]


def _plan(dialect: str, dml: Any, with_outbox: bool) -> Plan:
    event = _sequential_insert(EVENTS, _EVENT_COLUMNS, "e_")
    outbox = _sequential_insert(OUTBOX, _OUTBOX_COLUMNS, "o_").returning(OUTBOX.c.id)
    if dialect != "postgresql":
        return Plan(dml, event, outbox if with_outbox else None, None)
    changed = dml.cte("changed")
    at = changed.c.updated_at
    combined = select(changed)
    if with_outbox:
        due = func.coalesce(changed.c.next_retry_at, at)
        ob = _insert_from_changed(OUTBOX, _OUTBOX_COLUMNS, "o_", {
            "job_id": changed.c.job_id, "created_at": at, "available_at": due})  # fmt: skip
        ob_cte = ob.returning(OUTBOX.c.id).cte("ob")
        combined = select(changed, select(ob_cte.c.id).scalar_subquery().label("_outbox_id"))
    ev = _insert_from_changed(EVENTS, _EVENT_COLUMNS, "e_", {"job_id": changed.c.job_id,
                                                             "at": at})  # fmt: skip
    return Plan(dml, event, outbox, combined.add_cte(ev.cte("ev")))


def _run(
    conn: Connection, plan: Plan, params: dict[str, Any], event: Event, out: Outgoing | None
) -> tuple[dict[str, Any] | None, PendingMessage | None]:
    """Run a plan: on PostgreSQL one statement (one round trip, atomic even in autocommit),
    elsewhere its parts in sequence in the caller's transaction."""
    params = {**params, **_prefixed(event.values(None), "e_")}
    if out is not None:
        params |= _prefixed(out.values(event.spec.module), "o_")
    if plan.combined is not None:
        row = _first_row(prepared.execute(conn, plan.combined, params))
        if row is None:
            return None, None
        outbox_id = row.pop("_outbox_id", None)
        if out is None or not outbox_id:
            return row, None
        return row, out.pending(int(outbox_id), _available_at(row))
    row = _first(conn, plan.dml, params)
    if row is None:
        return None, None
    conn.execute(plan.event, {**params, "e_job_id": row["job_id"]})
    if out is None or plan.outbox is None:
        return row, None
    outbox_id = conn.execute(plan.outbox, {**params, "o_job_id": row["job_id"]}).scalar_one()
    return row, out.pending(int(outbox_id), _available_at(row))


def _row_columns(spec: RunTable) -> tuple[str, ...]:
    return tuple(c.name for c in spec.table.c)


def _delay_param() -> Any:
    return bindparam("r_delay", type_=Interval())


@cache
def _insert_plan(spec: RunTable, dialect: str, state: State) -> Plan:
    """none -> queued (an enqueue, with its outbox row) or running (a foreign claim)."""
    table = spec.table
    insert_stmt = pg_insert(table) if dialect == "postgresql" else sqlite_insert(table)
    values = {c: _bind(table, c) for c in _row_columns(spec)}
    if dialect == "postgresql":
        now = _clock_param(dialect)
        start = func.coalesce(values["next_retry_at"], now + _delay_param())
        values |= {"created_at": now, "updated_at": now, "next_retry_at": start}
        if state is State.RUNNING:
            values |= {"started_at": now, "heartbeat_at": now}
    # An enqueue's caller needs only when its message is due; a foreign claim's worker
    # needs the whole row it runs.
    queued = (table.c.job_id, table.c.next_retry_at, table.c.updated_at)
    returned = queued if state is State.QUEUED else tuple(table.c)
    dml = insert_stmt.values(values).on_conflict_do_nothing().returning(*returned)
    return _plan(dialect, dml, with_outbox=state is State.QUEUED)


def _fence_params(table: Table) -> tuple[Any, ...]:
    """The fence of a running attempt's writes: its attempt, and the token of the claim
    that took it (two claims of one attempt exist once a database crash lost the first);
    a revoke's cancel request closes it too: the attempt may only end cancelled then."""
    return (*_claim_fence(table), table.c.cancel_requested_at.is_(None))


def _claim_fence(table: Table) -> tuple[Any, ...]:
    return (
        table.c.job_id == _bind(table, "job_id"),
        table.c.state == State.RUNNING.value,
        table.c.attempts == _bind(table, "attempts"),
        table.c.claim_token == _bind(table, "claim_token"),
    )


@cache
def _claim_plan(spec: RunTable, dialect: str) -> Plan:
    table = spec.table
    now = _clock_param(dialect)
    dml = (
        update(table)
        .where(
            table.c.job_id == _bind(table, "job_id"),
            table.c.state == State.QUEUED.value,
            table.c.attempts == bindparam("r_previous", type_=table.c.attempts.type),
            or_(table.c.next_retry_at.is_(None), table.c.next_retry_at <= now),
            # Past its expiry a queued run is not claimed; the refused claim expires it.
            or_(table.c.expires_at.is_(None), table.c.expires_at > now),
        )
        .values(
            state=State.RUNNING.value, attempts=_bind(table, "attempts"), started_at=now,
            heartbeat_at=now, next_retry_at=None, worker=_bind(table, "worker"), updated_at=now,
            claim_token=_bind(table, "claim_token"),
        )
        .returning(*table.c)
    )  # fmt: skip
    return _plan(dialect, dml, with_outbox=False)


@cache
def _finish_plan(spec: RunTable, dialect: str) -> Plan:
    table = spec.table
    now = _clock_param(dialect)
    dml = (
        update(table)
        .where(*_fence_params(table))
        .values(
            state=_bind(table, "state"), outcome=_bind(table, "outcome"),
            last_error=_bind(table, "last_error"), result=_bind(table, "result"),
            finished_at=now, updated_at=now, next_retry_at=None,
        )
        .returning(table.c.job_id, table.c.updated_at)
    )  # fmt: skip
    return _plan(dialect, dml, with_outbox=False)


@cache
def _requeue_plan(spec: RunTable, dialect: str) -> Plan:
    table = spec.table
    now = _clock_param(dialect)
    due = _bind(table, "next_retry_at")
    if dialect == "postgresql":
        due = func.coalesce(due, now + _delay_param())
    dml = (
        update(table)
        .where(*_fence_params(table))
        .values(
            state=State.QUEUED.value, next_retry_at=due, last_error=_bind(table, "last_error"),
            heartbeat_at=None, updated_at=now,
            max_attempts=table.c.max_attempts + bindparam("r_refund", type_=Integer()),
        )
        .returning(*table.c)
    )  # fmt: skip
    return _plan(dialect, dml, with_outbox=True)


@cache
def _heartbeat_stmt(spec: RunTable, dialect: str) -> Any:
    table = spec.table
    return update(table).where(*_fence_params(table)).values(heartbeat_at=_clock_param(dialect))
