"""Retention of the journal: terminal runs, delivered outbox rows and old events.

Policy (defaults): terminal run rows are deleted 7 days after they finished (this must
exceed every task's dedup window, or an old job id could run again); delivered outbox
rows after 1 day; job_events after 30 days. Each table is cut in bounded batches.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, Table, delete, select

from jobsapp.db import utcnow
from jobsapp.lifecycle import journal, registry
from jobsapp.lifecycle.states import TERMINAL_STATES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionConfig:
    runs: timedelta = timedelta(days=7)
    delivered_outbox: timedelta = timedelta(days=1)
    events: timedelta = timedelta(days=30)
    batch: int = 1000


def _cut(conn: Connection, table: Table, key: str, *where: object, limit: int) -> int:
    doomed = select(table.c[key]).where(*where).limit(limit)  # type: ignore[arg-type]
    return conn.execute(delete(table).where(table.c[key].in_(doomed))).rowcount


def _cut_runs(conn: Connection, spec: registry.RunTable, before: datetime, limit: int) -> int:
    table = spec.table
    return _cut(conn, table, "job_id", table.c.state.in_(TERMINAL_STATES),
                table.c.finished_at < before, limit=limit)  # fmt: skip


def run_once(engine: Engine, cfg: RetentionConfig) -> dict[str, int]:
    now = utcnow()
    counts: dict[str, int] = {}
    with engine.begin() as conn:
        for spec in registry.all_tables():
            counts[spec.module] = _cut_runs(conn, spec, now - cfg.runs, cfg.batch)
        out = journal.OUTBOX
        counts["outbox"] = _cut(conn, out, "id", out.c.delivered_at < now - cfg.delivered_outbox,
                                limit=cfg.batch)  # fmt: skip
        ev = journal.EVENTS
        counts["job_events"] = _cut(conn, ev, "id", ev.c.at < now - cfg.events, limit=cfg.batch)
    # An idle pass is noise; one that deleted rows is worth a line.
    log.log(logging.INFO if any(counts.values()) else logging.DEBUG, "retention: %s", counts)
    return counts
