"""The happy path the run row carries instead of event rows, read back as events.

A successful job journals its enqueue, claim and success on its run row alone:
``enqueued_by`` (with ``created_at``) is Transition.ENQUEUE, ``attempted_at`` (with
``worker`` and ``attempts``) the CLAIM of the current attempt, and ``finished_at`` of a
succeeded row carrying that claim its SUCCEED. Every other transition keeps its event row
(the audit trail), and an attempt that ends otherwise than by success first writes the
claim its row carried as an event row (events.py ``kept_claim``), as does a rerun of a
success for both its claim and its success (reopen.py). So the row stands for a claim only
while running or succeeded, and the two sources never tell one transition twice. Rows
written before migration 0015 (both columns NULL) have all their event rows.

Readers take the union, ordered by time: ``history`` (one job: the timeline, tests),
``window`` (the events of a time window: charts, queues). The metrics rollup counts
successes from the rows, after a cursor on ``finished_at`` per run table
(``finish_cursor``); a rerun of a success the rollup already counted
(``counted_through``) marks its kept events ``COUNTED`` so the event pass does not count them again.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, String, Table, and_, cast, literal, select, union_all, update

from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.journal._sql import EVENTS, upsert
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.tables import MaintenanceCounter
from jobsapp.lifecycle.rules.states import ALL_STATES, State, Transition

COUNTERS: Table = MaintenanceCounter.__table__  # type: ignore[assignment]
# The reason of a success's events kept at its rerun: KEPT, or COUNTED when the metrics
# rollup had already counted the success from its row.
KEPT = "kept from the run row at rerun"
COUNTED = f"{KEPT} (metrics counted it from the row)"
_CURSOR = "metrics_finish_cursor:"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)
# The states in which a row's ``attempted_at`` is a claim with no event row.
CARRYING = (State.RUNNING.value, State.SUCCEEDED.value)


def _event(
    module: str,
    row: Mapping[str, Any],
    attempt: int,
    transition: Transition,
    from_state: State | None,
    to_state: State,
    actor: Any,
    at: datetime,
) -> dict[str, Any]:
    return {
        "id": None,
        "module": module,
        "job_id": row["job_id"],
        "attempt": attempt,
        "transition": transition.value,
        "from_state": from_state and from_state.value,
        "to_state": to_state.value,
        "actor": actor,
        "reason": None,
        "at": at,
        "detail": None,
    }


def row_events(module: str, row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The events ``row`` carries, shaped as ``job_events`` rows (``id`` None)."""
    out = []
    if row.get("enqueued_by") is not None:
        out.append(
            _event(
                module,
                row,
                1,
                Transition.ENQUEUE,
                None,
                State.QUEUED,
                row["enqueued_by"],
                row["created_at"],
            )
        )
    claimed = row.get("attempted_at")
    if claimed is not None and row["state"] in CARRYING:
        attempt, worker = int(row["attempts"]), row["worker"]
        out.append(
            _event(
                module, row, attempt, Transition.CLAIM, State.QUEUED, State.RUNNING, worker, claimed
            )
        )
        if row["state"] == State.SUCCEEDED.value:
            out.append(
                _event(
                    module,
                    row,
                    attempt,
                    Transition.SUCCEED,
                    State.RUNNING,
                    State.SUCCEEDED,
                    worker,
                    row["finished_at"],
                )
            )
    return out


def history(conn: Connection, spec: RunTable, job_id: uuid.UUID) -> list[dict[str, Any]]:
    """Every event of one job, event rows and the row's alike, in the order they happened
    (by time; the row's enqueue first and its claim and success last at a tie)."""
    table = spec.table
    run = conn.execute(select(table).where(table.c.job_id == job_id)).mappings().first()
    stmt = (
        select(EVENTS)
        .where(EVENTS.c.module == spec.module, EVENTS.c.job_id == job_id)
        .order_by(EVENTS.c.id)
    )
    rows = [dict(r) for r in conn.execute(stmt).mappings()]
    carried = [] if run is None else row_events(spec.module, dict(run))
    enqueue = [e for e in carried if e["transition"] == Transition.ENQUEUE.value]
    rest = [e for e in carried if e["transition"] != Transition.ENQUEUE.value]
    return sorted([*enqueue, *rows, *rest], key=lambda e: e["at"])


def carries_claim(table: Table) -> Any:
    """Whether a run row carries its current attempt's claim (``attempted_at``)."""
    return and_(table.c.attempted_at.is_not(None), table.c.state.in_(CARRYING))


def carries_success(table: Table) -> Any:
    return and_(table.c.attempted_at.is_not(None), table.c.state == State.SUCCEEDED.value)


def carried(spec: RunTable, since: datetime, kinds: Iterable[str]) -> list[Any]:
    """The events of ``kinds`` the rows of ``spec`` carry from ``since`` on, as SELECTs of
    (module, job_id, attempt, transition, at), one per kind. Every such event is no later
    than its row's ``updated_at``, so each reads the (state, updated_at) index."""
    t = spec.table
    recent = and_(t.c.state.in_(ALL_STATES), t.c.updated_at >= since)
    branches = {
        Transition.ENQUEUE.value: (literal(1), t.c.created_at, t.c.enqueued_by.is_not(None)),
        Transition.CLAIM.value: (t.c.attempts, t.c.attempted_at, carries_claim(t)),
        Transition.SUCCEED.value: (t.c.attempts, t.c.finished_at, carries_success(t)),
    }
    selects = []
    for kind in (k for k in kinds if k in branches):
        attempt, at, carries = branches[kind]
        selects.append(
            select(
                cast(literal(spec.module), String(64)).label("module"),
                t.c.job_id,
                attempt.label("attempt"),
                cast(literal(kind), String(32)).label("transition"),
                at.label("at"),
            ).where(recent, carries, at >= since)
        )
    return selects


def window(since: datetime, kinds: Iterable[str]) -> Any:
    """Every event of ``kinds`` from ``since`` on, event rows and the rows' alike, as a
    subquery of (module, job_id, attempt, transition, at)."""
    kinds = list(kinds)
    e = EVENTS.c
    rows = select(e.module, e.job_id, e.attempt, e.transition, e.at).where(
        e.at >= since, e.transition.in_(kinds)
    )
    spread = [s for spec in registry.all_tables() for s in carried(spec, since, kinds)]
    return union_all(rows, *spread).subquery("journal_window")


# ------------------------------------------------------------- the rollup's cursor


def _cursor_name(module: str) -> str:
    return _CURSOR + module


def _encode(at: datetime) -> int:
    return (at.astimezone(UTC) - _EPOCH) // _MICRO


def counted_through(conn: Connection, module: str) -> datetime:
    """The ``finished_at`` through which the rollup counted ``module``'s successes from
    their rows, locked for share by a rerun of a success: no pass counts the row while the
    rerun decides (a pass in progress is waited out)."""
    return _finish_cursor(conn, module, share=True) or _EPOCH


def finish_cursor(conn: Connection, module: str) -> datetime | None:
    """The same cursor locked for update by the rollup, or None while a rerun or another
    pass holds it: the table is skipped this pass, so a rerun inside a long application
    transaction delays that table's count, never the rollup itself."""
    return _finish_cursor(conn, module, share=False)


def _finish_cursor(conn: Connection, module: str, *, share: bool) -> datetime | None:
    return time_cursor(conn, _cursor_name(module), share=share)


def time_cursor(conn: Connection, name: str, *, share: bool) -> datetime | None:
    """A time kept in ``maintenance_counters`` (the epoch at first), locked for share, or
    for update skipping a locked one (None then)."""
    conn.execute(upsert(conn, COUNTERS).values(name=name, value=0).on_conflict_do_nothing())
    stmt = select(COUNTERS.c.value).where(COUNTERS.c.name == name)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update(read=share, skip_locked=not share)
    value = conn.execute(stmt).scalar()
    return None if value is None else _EPOCH + int(value) * _MICRO


def move_finish_cursor(conn: Connection, module: str, through: datetime) -> None:
    move_time_cursor(conn, _cursor_name(module), through)


def move_time_cursor(conn: Connection, name: str, through: datetime) -> None:
    stmt = update(COUNTERS).where(COUNTERS.c.name == name)
    conn.execute(stmt.values(value=_encode(through)))


def kept_at_rerun(
    conn: Connection, spec: RunTable, row: Mapping[str, Any], counted_through: datetime
) -> None:
    """A rerun's record of the success ``row`` carried: its claim and success as event
    rows (reason KEPT, or COUNTED once the rollup counted the row)."""
    reason = COUNTED if row["finished_at"] <= counted_through else KEPT
    kept = [e for e in row_events(spec.module, row) if e["transition"] != Transition.ENQUEUE.value]
    for event in kept:
        values = {k: v for k, v in event.items() if k != "id"}
        conn.execute(EVENTS.insert().values({**values, "reason": reason}))
