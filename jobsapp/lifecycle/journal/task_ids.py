"""Which active run an attempt's own Celery task id names (the id Flower lists).

An attempt's task id is ``message.task_id_for(job_id, attempt)``, a name-based UUID that
cannot be turned back into its job; the journal keeps no column of them. So the runs that
can still be stopped (running, then queued) are read through the state index and each
one's attempts so far (and, for a queued run, its next) are named until one matches:
linear in the active runs, and paid only by a revoke whose id names no run directly
(lifecycle/celery_api/revoke.py). No write.
"""

from __future__ import annotations

import uuid

from sqlalchemy import Connection, select

from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules.message import task_id_for
from jobsapp.lifecycle.rules.states import State

# Rows fetched per round trip while scanning (a server-side cursor on PostgreSQL).
_STREAMED = {"stream_results": True, "yield_per": 1000}


def job_of_attempt(conn: Connection, spec: RunTable, task_id: str) -> uuid.UUID | None:
    """The active run in ``spec`` one of whose attempts was published as ``task_id``."""
    table = spec.table
    # Running first: what Flower shows at work; a queued run's next attempt has an id too.
    for state, ahead in ((State.RUNNING, 0), (State.QUEUED, 1)):
        stmt = select(table.c.job_id, table.c.attempts).where(table.c.state == state.value)
        with conn.execute(stmt, execution_options=_STREAMED) as rows:
            for job_id, attempts in rows:
                if _named(task_id, job_id, int(attempts) + ahead):
                    found: uuid.UUID = job_id
                    return found
    return None


def _named(task_id: str, job_id: uuid.UUID, attempts: int) -> bool:
    return any(task_id_for(job_id, n) == task_id for n in range(1, attempts + 1))
