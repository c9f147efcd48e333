"""The two writes of a run's ``result`` column outside its success: Celery's
``update_state`` progress of a running attempt, and ``forget`` of a finished run's value;
and Celery's ``children`` of a success, which its attempt keeps in the run's parameters in
the success's transaction (``keep_children``).

None moves the run's state (no transition of ``states.ALLOWED``). Progress is fenced as
a heartbeat is, by the attempt's claim (fence.py), so an attempt that
lost its claim cannot write over its successor's; the succeed statement later overwrites
it with the body's return value. ``forget`` clears only a finished run's value.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, update

from jobsapp.lifecycle.journal.fence import held
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.run import Run
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


# The key of a run's parameters that holds Celery's ``children`` of its success: the result
# tuples of the calls its body made, and the attempt that made them (a replay's later
# success that makes none must not answer an earlier attempt's).
CHILDREN = "children"


def keep_children(
    conn: Connection, spec: RunTable, run: Run, token: uuid.UUID, children: list[Any]
) -> None:
    """The claimed ``run``'s attempt keeps ``children`` (Celery's result tuples) in its
    parameters, in the transaction of its success and under the same fence: a refused
    fence writes nothing, and the success is refused alike. A domain table keeps no
    parameters, so its runs answer no children (docs/celery-compat.md)."""
    if spec.params_column is None:
        return
    table = spec.table
    params = dict(run.columns[spec.params_column] or {})
    params[CHILDREN] = {"attempt": run.attempts, "results": children}
    stmt = (
        update(table)
        .where(*held(table, run.job_id, run.attempts, token))
        .values({spec.params_column: params})
    )
    conn.execute(stmt)


def kept_children(spec: RunTable, run: Run) -> list[Any]:
    """The result tuples the succeeded ``run``'s last attempt kept (``keep_children``)."""
    if spec.params_column is None:
        return []
    kept: Mapping[str, Any] | None = (run.columns[spec.params_column] or {}).get(CHILDREN)
    if kept is None or kept["attempt"] != run.attempts:
        return []
    return list(kept["results"])
