"""``metric_totals``: the counters /metrics reads, each added to by one upsert.

Beat's rollup (``monitor.rollup``) adds what the journal's events say. A duplicate enqueue
writes no event, so the producer counts its dedup hit here itself: the engine owns the
table (``tables.MetricTotal``) and this write, and counts without knowing the monitor.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.exc import SQLAlchemyError

from jobsapp.lifecycle.journal import add_to_values
from jobsapp.lifecycle.journal.tables import MetricTotal

log = logging.getLogger(__name__)

TOTALS: Table = MetricTotal.__table__  # type: ignore[assignment]

DEDUP_HITS = "dedup_hits"

Key = tuple[str, str, str, str]  # metric, module, task, label


def add(conn: Connection, totals: Mapping[Key, int]) -> None:
    """Add ``totals`` to ``metric_totals`` (rows created at zero)."""
    rows = [
        {"metric": m, "module": mod, "task": t, "label": lab, "value": v}
        for (m, mod, t, lab), v in totals.items()
        if v
    ]
    add_to_values(conn, TOTALS, rows)


def count_dedup_hit(engine: Engine, module: str, task: str) -> None:
    """A producer's enqueue absorbed as a duplicate: it has no event, so it counts here.

    Only duplicates pay this write; losing it must not fail the producer's call."""
    try:
        with engine.begin() as conn:
            add(conn, {(DEDUP_HITS, module, task[:200], ""): 1})
    except SQLAlchemyError as exc:
        log.warning("dedup hit not counted: %s", type(exc).__name__)
