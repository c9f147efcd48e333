"""``run_counts``: how many finished runs each run table holds, kept beside the journal.

A count of finished runs by state was a GROUP BY over the whole run table on every page
load and scrape (issue 37). The count is kept instead, by three kinds of writers:

- beat's metrics rollup (``monitor.rollup``) adds each run that entered a terminal state,
  after a ``finished_at`` cursor per run table (``counting``: locked for update, skipped
  while locked), in the transaction that moves the cursor;
- retention's delete of finished runs and a replay's or rerun's reopen of one take it off
  in their own transaction (``uncount``), if the rollup counted it: its ``finished_at`` is
  at or before the cursor, read locked for share, so no pass moves it meanwhile.

A workflow is counted with its last finished run (the latest ``finished_at``, then job
id), by the pass that counts that run, if the workflow no longer runs then; a reopen of
one of its runs, an operator's cancel of its rest and its retention adjust it
(``counted_before``, then ``recount``), in their own transaction.

A worker's finish writes nothing more. A reopen clears ``finished_at`` and every way into a
terminal state stamps it anew, so a run is counted once per finish. The counts are of the
rows the table holds: a run deleted by retention is no longer counted.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Table, select

from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.journal._sql import add_to_values
from jobsapp.lifecycle.journal.reads import step_runs
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.row_events import move_time_cursor, time_cursor
from jobsapp.lifecycle.journal.tables import RunCount, WorkflowCount, WorkflowStep
from jobsapp.lifecycle.rules.states import ACTIVE_STATES, TERMINAL_STATES, State

FINISHED: Table = RunCount.__table__  # type: ignore[assignment]
WORKFLOWS: Table = WorkflowCount.__table__  # type: ignore[assignment]
STEPS: Table = WorkflowStep.__table__  # type: ignore[assignment]
RUNNING = "running"
# A step's trigger when it is an errback (workflow.FAILURE): never waited for.
_ERRBACK = "failure"
_CURSOR = "run_counts_cursor:"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# module, task, queue ('' for the default), state, outcome ('' for none)
CountKey = tuple[str, str, str, str, str]


def columns(spec: RunTable) -> list[Any]:
    """What a counted row must carry: its key and its ``finished_at``."""
    c = spec.table.c
    return [c.job_id, c.workflow_id, c.task_name, c.queue, c.state, c.outcome, c.finished_at]


def key_of(module: str, row: Mapping[Any, Any]) -> CountKey:
    return (module, row["task_name"], row["queue"] or "", row["state"], row["outcome"] or "")


def add(conn: Connection, deltas: Mapping[CountKey, int]) -> None:
    """Add ``deltas`` (negative to take off) to the counts, rows created at zero."""
    rows = [
        {"module": m, "task": t, "queue": q, "state": s, "outcome": o, "value": n}
        for (m, t, q, s, o), n in deltas.items()
        if n
    ]
    add_to_values(conn, FINISHED, rows)


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


# ------------------------------------------------------------------- workflows


def workflow_state(*, active: bool, failed: bool, waiting: bool) -> str:
    """``running`` while a step is queued or running, or waits for a step still to come
    with nothing failed; else ``failed`` if a step failed or is blocked; else
    ``succeeded``."""
    if active or (waiting and not failed):
        return RUNNING
    return State.FAILED.value if failed else State.SUCCEEDED.value


@dataclass(frozen=True)
class Standing:
    state: str
    # The latest finished run: (finished_at, job_id, module); None with none finished.
    last: tuple[datetime, uuid.UUID, str] | None


def standings(conn: Connection, workflow_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, Standing]:
    """Where each workflow stands, from its steps and their runs (by index and key)."""
    if not workflow_ids:
        return {}
    cols = STEPS.c
    stmt = select(cols.workflow_id, cols.job_id, cols.module, cols.trigger, cols.blocked_at)
    found = conn.execute(stmt.where(cols.workflow_id.in_(list(workflow_ids)))).mappings()
    # A step of a run table this process does not know reads as still to come: its
    # workflow is not counted here, as it cannot be told finished.
    known = {spec.module for spec in registry.all_tables()}
    steps = [dict(step) for step in found]
    runs = step_runs(conn, [s for s in steps if s["module"] in known], "state", "finished_at")
    by_workflow: dict[uuid.UUID, list[Mapping[str, Any]]] = defaultdict(list)
    for step in steps:
        by_workflow[step["workflow_id"]].append(step)
    return {w: standing(mine, runs) for w, mine in by_workflow.items()}


def standing(steps: Sequence[Mapping[str, Any]], runs: Mapping[uuid.UUID, Any]) -> Standing:
    """One workflow's standing from its steps and the runs they have (pure)."""
    active = failed = waiting = False
    last: tuple[datetime, uuid.UUID, str] | None = None
    for step in steps:
        run = runs.get(step["job_id"])
        blocked = step["blocked_at"] is not None
        failed |= blocked or (run is not None and run.state == State.FAILED.value)
        if run is None:
            waiting |= not blocked and step["trigger"] != _ERRBACK
            continue
        active |= run.state in ACTIVE_STATES
        if run.finished_at is not None:
            mark = (run.finished_at, run.job_id, step["module"])
            last = mark if last is None or mark > last else last
    return Standing(workflow_state(active=active, failed=failed, waiting=waiting), last)


def count_workflows(conn: Connection, module: str, rows: Sequence[Mapping[Any, Any]]) -> None:
    """The rollup's part: the workflows whose last finished run is among ``rows`` (just
    counted) and that no longer run."""
    mine = {(r["job_id"], module) for r in rows}
    ids = {r["workflow_id"] for r in rows if r["workflow_id"] is not None}
    done = Counter(
        s.state
        for s in standings(conn, ids).values()
        if s.state != RUNNING and s.last is not None and (s.last[1], s.last[2]) in mine
    )
    _add_workflows(conn, done)


def counted_before(conn: Connection, workflow_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, str]:
    """The state each workflow is counted under now (those counted only), read before a
    change to it; ``recount`` after the change adjusts the counts."""
    found = {}
    for workflow_id, s in standings(conn, workflow_ids).items():
        if s.state == RUNNING or s.last is None:
            continue
        finished_at, _, module = s.last
        if finished_at <= counted_through(conn, module):
            found[workflow_id] = s.state
    return found


def recount(conn: Connection, before: Mapping[uuid.UUID, str]) -> None:
    """After a change to the workflows of ``before`` (``counted_before``): each counted
    under its state now instead."""
    if not before:
        return
    delta = Counter(counted_before(conn, list(before)).values())
    delta.subtract(Counter(before.values()))
    _add_workflows(conn, delta)


def _add_workflows(conn: Connection, deltas: Mapping[str, int]) -> None:
    rows = [{"state": state, "value": n} for state, n in deltas.items() if n]
    add_to_values(conn, WORKFLOWS, rows)


def workflow_totals(conn: Connection) -> dict[str, int]:
    """Finished workflows by state (a row per state)."""
    rows = conn.execute(select(WORKFLOWS.c.state, WORKFLOWS.c.value))
    return {str(state): int(n) for state, n in rows}
