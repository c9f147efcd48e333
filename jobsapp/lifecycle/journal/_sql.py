"""The two tables every transition appends to, and what every journal statement shares.

``EVENTS`` (a transition's ``job_events`` row, events.py) and ``OUTBOX`` (the message of
the attempt it schedules, outbox_rows.py); the dialect's INSERT with ON CONFLICT
(``upsert``) and the upsert that adds to a kept total (``add_to_values``), a statement's
first row (``_first``), and the refusal of a transition of several statements on an
autocommit connection (``_require_transaction``: reopen.py, cancel.py, enqueue_many.py). No
transition of its own; only this package's modules import it, except through the
package: ``journal.upsert`` is every upsert of the project (the monitor's counters, the
console's throttle, the attachments' variants), ``journal.add_to_values`` every kept
total's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, CursorResult, Table
from sqlalchemy.dialects.postgresql import dml as pg_dml
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import dml as sqlite_dml
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from jobsapp.db import is_autocommit
from jobsapp.lifecycle.journal.tables import JobEvent, OutboxMessage

OUTBOX: Table = OutboxMessage.__table__  # type: ignore[assignment]
EVENTS: Table = JobEvent.__table__  # type: ignore[assignment]


def upsert(conn: Connection, table: Table) -> pg_dml.Insert | sqlite_dml.Insert:
    """INSERT with the dialect's ON CONFLICT support (both spell it the same)."""
    return upsert_of(conn.dialect.name, table)


def upsert_of(dialect: str, table: Table) -> pg_dml.Insert | sqlite_dml.Insert:
    """``upsert`` for a dialect named ahead of any connection (a statement built once)."""
    return pg_insert(table) if dialect == "postgresql" else sqlite_insert(table)


def add_to_values(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Add each row's ``value`` to the row of its primary key, created at zero: one
    upsert for every total kept this way (metric_totals, run_counts, workflow_counts)."""
    if not rows:
        return
    stmt = upsert(conn, table).values(list(rows))
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=list(table.primary_key.columns),
            set_={"value": table.c.value + stmt.excluded.value},
        )
    )


def _first(
    conn: Connection, stmt: Any, params: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    return _first_row(conn.execute(stmt, params))


def _first_row(result: CursorResult[Any]) -> dict[str, Any] | None:
    row = result.first()
    return None if row is None else row._asdict()


def _require_transaction(conn: Connection, transition: str) -> None:
    """Refuse a multi-statement transition on an autocommit connection, where a crash
    between its statements would commit a part (a row queued with no message)."""
    if is_autocommit(conn):
        raise RuntimeError(f"{transition} takes several statements: run it in a transaction")
