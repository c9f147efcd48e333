"""``run_counts``: how many finished runs each run table holds, kept beside the journal.

A count of finished runs by state was a GROUP BY over the whole run table on every page
load and scrape (issue 37). The count is kept instead, by three kinds of writers:

- beat's metrics rollup (``monitor.rollup``) adds each run that entered a terminal state,
  after a ``finished_at`` cursor per run table (``counting``: locked for update, skipped
  while locked), in the transaction that moves the cursor;
- retention's delete of finished runs and a replay's or rerun's reopen of one take it off
  in their own transaction (``uncount``), if the rollup counted it: its ``finished_at`` is
  at or before the cursor, read locked for share, so no pass moves it meanwhile.

A worker's finish writes nothing more. A reopen clears ``finished_at`` and every way into a
terminal state stamps it anew, so a run is counted once per finish. The counts are of the
rows the table holds: a run deleted by retention is no longer counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Table, select

from jobsapp.lifecycle.journal._sql import _upsert
from jobsapp.lifecycle.journal.row_events import move_time_cursor, time_cursor
from jobsapp.lifecycle.registry import RunTable
from jobsapp.lifecycle.states import TERMINAL_STATES
from jobsapp.lifecycle.tables import RunCount

FINISHED: Table = RunCount.__table__  # type: ignore[assignment]
_CURSOR = "run_counts_cursor:"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# module, task, queue ('' for the default), state, outcome ('' for none)
CountKey = tuple[str, str, str, str, str]
_KEY = ("module", "task", "queue", "state", "outcome")


def columns(spec: RunTable) -> list[Any]:
    """What a counted row must carry: its key and its ``finished_at``."""
    c = spec.table.c
    return [c.task_name, c.queue, c.state, c.outcome, c.finished_at]


def key_of(module: str, row: Mapping[Any, Any]) -> CountKey:
    return (module, row["task_name"], row["queue"] or "", row["state"], row["outcome"] or "")


def add(conn: Connection, deltas: Mapping[CountKey, int]) -> None:
    """Add ``deltas`` (negative to take off) to the counts, rows created at zero."""
    rows = [
        {"module": m, "task": t, "queue": q, "state": s, "outcome": o, "value": n}
        for (m, t, q, s, o), n in deltas.items()
        if n
    ]
    if not rows:
        return
    stmt = _upsert(conn, FINISHED).values(rows)
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[FINISHED.c[name] for name in _KEY],
            set_={"value": FINISHED.c.value + stmt.excluded.value},
        )
    )


def counting(conn: Connection, module: str) -> datetime | None:
    """The rollup's cursor of ``module``, locked for update; None while a reopen, a
    retention batch or another pass holds it (the table waits for the next pass)."""
    return time_cursor(conn, _CURSOR + module, share=False)


def counted(conn: Connection, module: str, through: datetime) -> None:
    move_time_cursor(conn, _CURSOR + module, through)


def counted_through(conn: Connection, module: str) -> datetime:
    """The cursor locked for share: a run finished at or before it was counted."""
    return time_cursor(conn, _CURSOR + module, share=True) or _EPOCH


def finished_row(conn: Connection, spec: RunTable, job_id: Any) -> Mapping[str, Any] | None:
    """The row's counted columns, locked for update: what a reopen takes off."""
    t = spec.table
    stmt = select(*columns(spec)).where(t.c.job_id == job_id)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    found = conn.execute(stmt).mappings().first()
    return None if found is None else dict(found)


def uncount(conn: Connection, module: str, rows: Iterable[Mapping[Any, Any]]) -> None:
    """Take off the counted ones of ``rows`` (read or deleted in this transaction)."""
    rows = [r for r in rows if r["state"] in TERMINAL_STATES and r["finished_at"] is not None]
    if not rows:
        return
    through = counted_through(conn, module)
    gone = Counter(key_of(module, r) for r in rows if r["finished_at"] <= through)
    add(conn, {k: -n for k, n in gone.items()})


def read(conn: Connection, module: str | None = None) -> dict[CountKey, int]:
    """Every count (of ``module``); the table holds a few rows per task and queue."""
    stmt = select(FINISHED)
    if module is not None:
        stmt = stmt.where(FINISHED.c.module == module)
    return {
        (r.module, r.task, r.queue, r.state, r.outcome): int(r.value)
        for r in conn.execute(stmt)
        if r.value
    }
