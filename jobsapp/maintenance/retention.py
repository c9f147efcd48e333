"""Retention of the journal: terminal runs, whole workflows, delivered outbox rows and old
events.

Policy (defaults): terminal run rows are deleted 7 days after they finished; delivered
outbox rows after 1 day; job_events after 30 days. Each table is cut in bounded batches.
A run of a workflow goes only with its whole workflow (its runs in every run table and its
steps, in one transaction), once none of its runs is queued or running and nothing in it
moved for the run retention: never half a workflow, and no step left behind without its
runs, which the console would count as still to come. A deleted run the rollup counted
leaves ``run_counts`` in the delete's transaction (journal/finished_counts.py).

A finished run is what absorbs a repeated enqueue of its job id during the task's dedup
window: deleted sooner, the same work would run again. So each pass first compares the
run retention with the longest dedup window of every registered lifecycle task and, if
the retention is shorter, deletes nothing: it logs an error and raises
``RetentionRefused`` (beat logs the failed pass and runs the others; ``jobsapp
maintenance run-once`` exits non-zero with the reason).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import Celery
from sqlalchemy import Connection, Engine, Table, delete, or_, select, tuple_

from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import finished_counts, registry
from jobsapp.lifecycle.journal.workflow import STEPS
from jobsapp.lifecycle.rules.states import TERMINAL_STATES
from jobsapp.lifecycle.task import LifecycleTask
from jobsapp.maintenance import budget
from jobsapp.maintenance.budget import Budget

log = logging.getLogger(__name__)

# Steps read per page per workflow a batch may cut (a chain of three is three rows).
STEPS_READ = 4


@dataclass(frozen=True)
class RetentionConfig:
    runs: timedelta = timedelta(days=7)
    delivered_outbox: timedelta = timedelta(days=1)
    events: timedelta = timedelta(days=30)
    # Rows per delete (one transaction each) and deletes per table per pass, inside the
    # pass budget: a pass that stopped at one batch capped pruning at 1,000 rows per table
    # per tick (144k a day at the default cadence), below what a busy journal adds.
    batch: int = 1000
    max_batches: int = 100


class RetentionRefused(Exception):
    """Runs would be deleted inside a task's dedup window; the pass deleted nothing."""


def refusal(keep_runs: timedelta, windows: Mapping[str, timedelta]) -> str | None:
    """Why the pass must not run: a dedup window longer than finished runs are kept."""
    if not windows:
        return None
    task, longest = max(windows.items(), key=lambda item: item[1])
    if longest <= keep_runs:
        return None
    return (
        f"finished runs are kept {_days(keep_runs)}, but task {task} absorbs repeated "
        f"enqueues for {_days(longest)}: deleting them sooner would let an old job id "
        f"run again; keep runs at least {_days(longest)} or shorten the window"
    )


def _days(span: timedelta) -> str:
    return f"{span.total_seconds() / 86400:g} days"


def dedup_windows(app: Celery) -> dict[str, timedelta]:
    """The dedup window of every lifecycle task the app registers, its modules imported."""
    # A beat or a one-off command knows the tasks only once the worker's imports are loaded.
    app.loader.import_default_modules()
    return {
        name: timedelta(seconds=task.dedup_window)
        for name, task in app.tasks.items()
        if isinstance(task, LifecycleTask)
    }


def _default_app() -> Celery:
    from jobsapp.celery_app import app

    return app


def _cut(conn: Connection, table: Table, key: str, *where: object, limit: int) -> int:
    doomed = select(table.c[key]).where(*where).limit(limit)  # type: ignore[arg-type]
    return conn.execute(delete(table).where(table.c[key].in_(doomed))).rowcount


def _cut_runs(conn: Connection, spec: registry.RunTable, before: datetime, limit: int) -> int:
    """Finished runs of their own (a workflow's go with it: ``_cut_workflows``)."""
    table = spec.table
    doomed = select(table.c.job_id).where(
        table.c.state.in_(TERMINAL_STATES),
        table.c.finished_at < before,
        table.c.workflow_id.is_(None),
    )
    return _delete_runs(conn, spec, table.c.job_id.in_(doomed.limit(limit)))


def _delete_runs(conn: Connection, spec: registry.RunTable, where: Any) -> int:
    """Delete runs, and take the counted ones off ``run_counts`` in the same transaction."""
    columns = finished_counts.columns(spec)
    gone = conn.execute(delete(spec.table).where(where).returning(*columns)).mappings().all()
    finished_counts.uncount(conn, spec.module, gone)
    return len(gone)


def _cut_workflows(conn: Connection, before: datetime, limit: int) -> int:
    """Up to ``limit`` whole workflows that aged out: steps all written and blocked before
    ``before``, and every run finished before it; their runs and steps go together."""
    doomed = _aged_workflows(conn, before, limit)
    if doomed:
        counted = finished_counts.counted_before(conn, doomed)
        for spec in registry.all_tables():
            _delete_runs(conn, spec, spec.table.c.workflow_id.in_(doomed))
        conn.execute(delete(STEPS).where(STEPS.c.workflow_id.in_(doomed)))
        finished_counts.recount(conn, counted)
    return len(doomed)


def _aged_workflows(conn: Connection, before: datetime, limit: int) -> list[Any]:
    """Up to ``limit`` workflows whose steps were all written and blocked before ``before``
    and whose runs all finished before it. The steps are read oldest first, a page at a
    time (``ix_workflow_steps_created``), and each page's workflows checked by their own
    steps and runs (``ix_workflow_steps_workflow``, ``ix_<table>_workflow``): what a batch
    reads is its ``limit`` and the workflows still alive past the cutoff, not the steps
    written since."""
    found: dict[Any, None] = {}
    after: tuple[datetime, Any] | None = None
    while len(found) < limit:
        page = _oldest_steps(conn, before, after, limit * STEPS_READ)
        candidates = list(dict.fromkeys(w for _, _, w in page if w not in found))
        alive = _alive(conn, candidates, before)
        found.update((w, None) for w in candidates if w not in alive)
        if len(page) < limit * STEPS_READ:
            break
        after = page[-1][:2]
    return list(found)[:limit]


def _oldest_steps(
    conn: Connection, before: datetime, after: tuple[datetime, Any] | None, n: int
) -> list[tuple[datetime, Any, Any]]:
    s = STEPS.c
    later = [] if after is None else [tuple_(s.created_at, s.job_id) > tuple_(*after)]
    stmt = (
        select(s.created_at, s.job_id, s.workflow_id)
        .where(s.created_at < before, *later)
        .order_by(s.created_at, s.job_id)
        .limit(n)
    )
    return [(at, job_id, workflow) for at, job_id, workflow in conn.execute(stmt)]


def _alive(conn: Connection, workflows: list[Any], before: datetime) -> set[Any]:
    """Of ``workflows``, those with a step written or blocked since ``before``, or a run
    not finished before it."""
    if not workflows:
        return set()
    s = STEPS.c
    moved = or_(s.created_at >= before, s.blocked_at >= before)
    stmts = [select(s.workflow_id).where(s.workflow_id.in_(workflows), moved)]
    for spec in registry.all_tables():
        runs = spec.table.c
        active = or_(runs.state.not_in(TERMINAL_STATES), runs.finished_at >= before)
        stmts.append(select(runs.workflow_id).where(runs.workflow_id.in_(workflows), active))
    return {w for stmt in stmts for w in conn.execute(stmt.distinct()).scalars()}


def _cuts(now: datetime, cfg: RetentionConfig) -> dict[str, Callable[[Connection], int]]:
    """One bounded delete per table, by name: every run table, then outbox and events."""
    out, ev = journal.OUTBOX, journal.EVENTS

    def runs(spec: registry.RunTable) -> Callable[[Connection], int]:
        return lambda conn: _cut_runs(conn, spec, now - cfg.runs, cfg.batch)

    cuts = {spec.module: runs(spec) for spec in registry.all_tables()}
    cuts["workflows"] = lambda conn: _cut_workflows(conn, now - cfg.runs, cfg.batch)
    cuts["outbox"] = lambda conn: _cut(
        conn, out, "id", out.c.delivered_at < now - cfg.delivered_outbox, limit=cfg.batch
    )
    cuts["job_events"] = lambda conn: _cut(
        conn, ev, "id", ev.c.at < now - cfg.events, limit=cfg.batch
    )
    return cuts


def _drain(
    engine: Engine, cut: Callable[[Connection], int], cfg: RetentionConfig, spent: Budget
) -> int:
    """Batches until a short one (nothing more has aged out), the cap, or the budget."""
    total = 0
    for _ in range(cfg.max_batches):
        with engine.begin() as conn:
            deleted = cut(conn)
        total += deleted
        if deleted < cfg.batch or not spent.allows_more():
            break
    return total


def run_once(engine: Engine, cfg: RetentionConfig, app: Celery | None = None) -> dict[str, int]:
    why = refusal(cfg.runs, dedup_windows(app or _default_app()))
    if why is not None:
        log.error("retention refused: %s", why)
        raise RetentionRefused(why)
    spent = budget.for_pass(budget.DEFAULT_BUDGET)
    counts = {name: _drain(engine, cut, cfg, spent) for name, cut in _cuts(utcnow(), cfg).items()}
    # An idle pass is noise; one that deleted rows is worth a line.
    log.log(logging.INFO if any(counts.values()) else logging.DEBUG, "retention: %s", counts)
    return counts
