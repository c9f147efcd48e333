"""The statement compiler: prebuilt plans, and ``_run``.

The hot transitions are built once per run table and dialect with bind parameters, so
each call only binds values: no statement construction, no cache-key walk. Parameter
names carry a prefix per part (r_ run row, e_ event, o_ outbox) so the parts can share
one statement.

``_insert_plan`` (Transition.ENQUEUE, and CLAIM by insert) is built here; the claim,
finish and requeue plans with the other hot statements in hot.py (their named home), over
``_plan``. ``_run`` binds and runs a plan. Writes nothing itself: the transition modules
of this package (enqueue_one.py, enqueue_many.py, claiming.py, finish.py) call it.

Each plan says which event rows it writes (``Journaled``): the happy path's enqueue, claim
and success are carried by the run row (``enqueued_by``, ``attempted_at``; row_events.py
reads them back as events), so those plans write none; an attempt that ends otherwise
writes the claim its row carried as an event row first, since the next claim overwrites it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from functools import cache
from typing import Any

from sqlalchemy import (
    Connection,
    Interval,
    Table,
    bindparam,
    cast,
    func,
    insert,
    literal,
    null,
    select,
    union_all,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from jobsapp.lifecycle.journal import prepared
from jobsapp.lifecycle.journal._sql import EVENTS, OUTBOX, _first
from jobsapp.lifecycle.journal.clock import _clock_param
from jobsapp.lifecycle.journal.events import Event, kept_claim
from jobsapp.lifecycle.journal.outbox_rows import Outgoing, PendingMessage
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.run import EndedAttempt
from jobsapp.lifecycle.rules.states import State, Transition

_EVENT_COLUMNS = (
    "module",
    "job_id",
    "attempt",
    "transition",
    "from_state",
    "to_state",
    "actor",
    "reason",
    "at",
    "detail",
)
_OUTBOX_COLUMNS = (
    "module",
    "job_id",
    "attempt",
    "task_name",
    "body",
    "created_at",
    "available_at",
    "queue",
    "priority",
)


def _bind(table: Table, column: str, prefix: str = "r_") -> Any:
    return bindparam(prefix + column, type_=table.c[column].type)


def _prefixed(values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {prefix + k: v for k, v in values.items()}


class Journaled(Enum):
    """The event rows a plan writes beside its run row."""

    EVENT = "event"  # the transition's event (a foreign claim: its row is not the record)
    ROW = "row"  # none: the row carries the transition (an enqueue, a claim)
    # A success: its event only where the row does not carry the claim (claimed before
    # migration 0015, or by insert), so the row cannot stand for the attempt.
    EVENT_UNLESS_ROW = "event_unless_row"
    # Any other end of an attempt: the claim the row carried, then the transition's event.
    CLAIM_AND_EVENT = "claim_and_event"


@dataclass(frozen=True)
class Plan:
    """One transition's statements: the guarded DML, then its event and outbox rows."""

    dml: Any
    event: Any
    outbox: Any | None
    combined: Any | None  # PostgreSQL: all parts as one statement
    journaled: Journaled = Journaled.EVENT

    def statements(self) -> tuple[Any, ...]:
        """What ``_run`` may execute: PostgreSQL's one statement, else the parts in order
        (the event row's insert is skipped at run time where the row carries the claim)."""
        if self.combined is not None:
            return (self.combined,)
        event = () if self.journaled is Journaled.ROW else (self.event,)
        outbox = () if self.outbox is None else (self.outbox,)
        return (self.dml, *event, *outbox)


def _sequential_insert(table: Table, columns: tuple[str, ...], prefix: str) -> Any:
    return insert(table).values({c: _bind(table, c, prefix) for c in columns})


def _insert_from_changed(
    table: Table, columns: tuple[str, ...], prefix: str, derived: Mapping[str, Any]
) -> Any:
    """INSERT one row per changed run row; ``derived`` columns come from that row (its
    job_id, and its timestamps: the database's clock, read once for all parts)."""
    return insert(table).from_select(list(columns), _selected(table, columns, prefix, derived))


def _selected(
    table: Table, columns: tuple[str, ...], prefix: str, derived: Mapping[str, Any]
) -> Any:
    """SELECT ``columns`` of a row of ``table``: ``derived`` ones as given, the others bound."""
    cols = [
        derived[c].label(c) if c in derived else _bind(table, c, prefix).label(c) for c in columns
    ]
    return select(*cols)


def _available_at(row: Mapping[str, Any]) -> datetime:
    """When the message a transition wrote is due: the run's next_retry_at, else at once."""
    due = row["next_retry_at"]
    return due if isinstance(due, datetime) else row["updated_at"]


def _plan(
    dialect: str, dml: Any, with_outbox: bool, journaled: Journaled = Journaled.EVENT
) -> Plan:
    event = _sequential_insert(EVENTS, _EVENT_COLUMNS, "e_")
    outbox = _sequential_insert(OUTBOX, _OUTBOX_COLUMNS, "o_").returning(OUTBOX.c.id)
    if dialect != "postgresql":
        return Plan(dml, event, outbox if with_outbox else None, None, journaled)
    changed = dml.cte("changed")
    at = changed.c.updated_at
    combined = select(changed)
    if with_outbox:
        due = func.coalesce(changed.c.next_retry_at, at)
        ob = _insert_from_changed(
            OUTBOX,
            _OUTBOX_COLUMNS,
            "o_",
            {"job_id": changed.c.job_id, "created_at": at, "available_at": due},
        )
        ob_cte = ob.returning(OUTBOX.c.id).cte("ob")
        combined = select(changed, select(ob_cte.c.id).scalar_subquery().label("_outbox_id"))
    if journaled is Journaled.ROW:
        return Plan(dml, event, outbox, combined, journaled)
    ev = _events_from_changed(changed, journaled)
    return Plan(dml, event, outbox, combined.add_cte(ev.cte("ev")), journaled)


def _events_from_changed(changed: Any, journaled: Journaled) -> Any:
    """The INSERT of a plan's event rows, reading the changed run row (PostgreSQL)."""
    carried = changed.c.attempted_at.is_not(None)
    mine = _event_select({"job_id": changed.c.job_id, "at": changed.c.updated_at})
    if journaled is Journaled.EVENT_UNLESS_ROW:
        mine = mine.where(~carried)
    if journaled is not Journaled.CLAIM_AND_EVENT:
        return insert(EVENTS).from_select(list(_EVENT_COLUMNS), mine)
    # One INSERT of both rows, claim first: the ids keep the order the timeline shows.
    claim = _event_select(
        {
            "job_id": changed.c.job_id,
            "attempt": changed.c.attempts,
            "transition": literal(Transition.CLAIM.value),
            "from_state": literal(State.QUEUED.value),
            "to_state": literal(State.RUNNING.value),
            "actor": changed.c.worker,
            "reason": cast(null(), EVENTS.c.reason.type),
            "at": changed.c.attempted_at,
            "detail": cast(null(), EVENTS.c.detail.type),
        }
    ).where(carried)
    return insert(EVENTS).from_select(list(_EVENT_COLUMNS), union_all(claim, mine))


def _event_select(derived: Mapping[str, Any]) -> Any:
    return _selected(EVENTS, _EVENT_COLUMNS, "e_", derived)


def _run(
    conn: Connection, plan: Plan, params: dict[str, Any], event: Event, out: Outgoing | None
) -> tuple[dict[str, Any] | None, PendingMessage | None]:
    """Run a plan: on PostgreSQL one statement (one round trip, atomic even in autocommit),
    elsewhere its parts in sequence in the caller's transaction."""
    if plan.journaled is not Journaled.ROW:  # the row carries the transition: no event
        params = {**params, **_prefixed(event.values(None), "e_")}
    if out is not None:
        params |= _prefixed(out.values(event.spec.module), "o_")
    if plan.combined is not None:
        row = prepared.first(conn, plan.combined, params)
        if row is None:
            return None, None
        outbox_id = row.pop("_outbox_id", None)
        if out is None or not outbox_id:
            return row, None
        return row, out.pending(int(outbox_id), _available_at(row))
    row = _first(conn, plan.dml, params)
    if row is None:
        return None, None
    _sequential_events(conn, plan, params, event, row)
    if out is None or plan.outbox is None:
        return row, None
    outbox_id = conn.execute(plan.outbox, {**params, "o_job_id": row["job_id"]}).scalar_one()
    return row, out.pending(int(outbox_id), _available_at(row))


def _sequential_events(
    conn: Connection, plan: Plan, params: dict[str, Any], event: Event, row: Mapping[str, Any]
) -> None:
    """The plan's event rows after its DML (not PostgreSQL), as ``_events_from_changed``."""
    carried = row.get("attempted_at") is not None
    if plan.journaled is Journaled.ROW or (
        plan.journaled is Journaled.EVENT_UNLESS_ROW and carried
    ):
        return
    ended = EndedAttempt.of(row) if plan.journaled is Journaled.CLAIM_AND_EVENT else None
    claim = None if ended is None else kept_claim(event.spec, ended)
    if claim is not None:
        conn.execute(plan.event, _prefixed(claim.values(row["job_id"]), "e_"))
    conn.execute(plan.event, {**params, "e_job_id": row["job_id"]})


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
    journaled = Journaled.ROW if state is State.QUEUED else Journaled.EVENT
    return _plan(dialect, dml, with_outbox=state is State.QUEUED, journaled=journaled)
