"""An operator's retry of dead outbox rows: each back to pending, due now, with a clean
count, and its ``outbox_retry`` audit row.

No run moves (the run stays queued), so no transition of ``states.ALLOWED``. Guarded by
``dead_at``: a row revived (or settled by the relay) meanwhile is not revived twice. On
PostgreSQL the rows and their audit rows are one statement; elsewhere two, in the caller's
transaction. Called by operator.py (``retry_dead_outbox``); the row's life before and after
(published, backed off, dead) is lifecycle/journal/outbox_queries.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection, select, update

from jobsapp.lifecycle.journal._sql import EVENTS, OUTBOX, _require_transaction
from jobsapp.lifecycle.journal.outbox_rows import PendingMessage, pending_rows
from jobsapp.lifecycle.journal.plans import (
    _EVENT_COLUMNS,
    _insert_from_changed,
    _prefixed,
    _sequential_insert,
)

# The audit row of an operator's retry of dead rows (not a transition of the run).
OUTBOX_RETRY = "outbox_retry"


def revive(
    conn: Connection, ids: Sequence[int] | None, *, actor: str, reason: str, now: datetime
) -> list[PendingMessage]:
    """Dead rows (the named ones, or all) back to pending, due now, with a clean count;
    each with its audit row in ``job_events`` (transition ``outbox_retry``)."""
    where = [OUTBOX.c.dead_at.is_not(None)]
    if ids is not None:
        where.append(OUTBOX.c.id.in_(list(ids)))
    fresh = {
        "dead_at": None,
        "published_at": None,
        "delivered_at": None,
        "publish_failures": 0,
        "last_error": None,
        "available_at": now,
    }
    revived = update(OUTBOX).where(*where).values(**fresh).returning(*OUTBOX.c)
    audited = {
        "transition": OUTBOX_RETRY,
        "from_state": None,
        "to_state": None,
        "actor": actor,
        "reason": reason,
        "at": now,
        "detail": None,
    }
    event = _prefixed(audited, "e_")
    if conn.dialect.name == "postgresql":
        rows = revived.cte("revived")
        of_row = {"module": rows.c.module, "job_id": rows.c.job_id, "attempt": rows.c.attempt}
        audit = _insert_from_changed(EVENTS, _EVENT_COLUMNS, "e_", of_row)
        stmt = select(rows).add_cte(audit.cte("audit"))
        return pending_rows(conn.execute(stmt, event).mappings())
    _require_transaction(conn, "a retry of dead outbox rows")
    found = list(conn.execute(revived).mappings())
    if found:
        audit_rows = [
            {**event, "e_module": r["module"], "e_job_id": r["job_id"], "e_attempt": r["attempt"]}
            for r in found
        ]
        conn.execute(_sequential_insert(EVENTS, _EVENT_COLUMNS, "e_"), audit_rows)
    return pending_rows(found)
