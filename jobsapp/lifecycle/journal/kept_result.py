"""The two writes of a run's ``result`` column outside its success: Celery's
``update_state`` progress of a running attempt, and ``forget`` of a finished run's value.

Neither moves the run's state (no transition of ``states.ALLOWED``). Progress is fenced as
a heartbeat is, by the attempt's claim (fence.py), so an attempt that
lost its claim cannot write over its successor's; the succeed statement later overwrites
it with the body's return value. ``forget`` clears only a finished run's value.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Connection, update

from jobsapp.lifecycle.journal.fence import held
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules.states import TERMINAL_STATES


def write_progress(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    attempt: int,
    token: uuid.UUID,
    value: Any,
) -> bool:
    """The running attempt holding ``token`` keeps ``value``; False: it holds no claim.
    A revoke's stop request does not refuse it: progress carries no work on."""
    table = spec.table
    stmt = (
        update(table)
        .where(*held(table, job_id, attempt, token, unless_stopped=False))
        .values(result=value)
    )
    return conn.execute(stmt).rowcount == 1


def forget_result(conn: Connection, spec: RunTable, job_id: uuid.UUID) -> bool:
    """A finished run's kept value is dropped; False: not finished (nothing to forget)."""
    table = spec.table
    stmt = (
        update(table)
        .where(
            table.c.job_id == job_id,
            table.c.state.in_(TERMINAL_STATES),
            table.c.result.is_not(None),
        )
        .values(result=None)
    )
    return conn.execute(stmt).rowcount == 1
