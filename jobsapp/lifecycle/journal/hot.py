"""The hot statements, named: the SQL every job, the reaper and the relay run.

What a reviewer reads to see the SQL of the hot path, kept together (docs/lifecycle.md,
"The hot statements"); the transitions of this package and the relay's queries run
these and no copies:

- ``claim``: Transition.CLAIM (claim.py)
- ``heartbeat``: a running attempt's heartbeat (heartbeat.py)
- ``finish``: Transition.SUCCEED and FAIL; ``requeue``: RETRY and SNOOZE (finish.py)
- ``stale_runs`` and ``reap``: the reaper's read and its guarded write (reap.py)
- ``due_firsts`` and ``due_rows``: the relay's pick of due outbox rows, and
  ``MARK_SENT_MANY`` / ``MARK_SENT_ONE``: the mark of rows sent
  (lifecycle/journal/outbox_queries.py)

``claim``, ``finish`` and ``requeue`` are ``Plan``s (plans.py: on PostgreSQL one statement
with the event and outbox rows, elsewhere its parts in sequence), built once per run table
and dialect; the others are built per call where a value shapes them (a batch's ids, a
cutoff). tests/golden/ holds each one's text as compiled (tests/unit/test_hot_sql.py;
``GOLDEN_UPDATE=1`` rewrites it), and tests/integration/test_bounded_reads.py
explains each on a planted journal: every one reads by an index.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    Interval,
    Table,
    bindparam,
    case,
    func,
    literal_column,
    or_,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from jobsapp.lifecycle.journal import fence
from jobsapp.lifecycle.journal._sql import OUTBOX
from jobsapp.lifecycle.journal.clock import _clock_param
from jobsapp.lifecycle.journal.flow_rows import not_paused
from jobsapp.lifecycle.journal.plans import Journaled, Plan, _bind, _delay_param, _plan
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules.states import Outcome, State

# An outbox row not given up on (``dead_at`` set by the relay after too many failures).
LIVE = OUTBOX.c.dead_at.is_(None)

# ---------------------------------------------------------------- the worker's


def _fence_params(table: Table) -> tuple[Any, ...]:
    """The claim fence (fence.py) over the plan's bind parameters."""
    bound = (_bind(table, "job_id"), _bind(table, "attempts"), _bind(table, "claim_token"))
    return fence.held(table, *bound)


@cache
def claim(spec: RunTable, dialect: str) -> Plan:
    """Transition.CLAIM: the next attempt of a due queued run -> running, a new token."""
    table = spec.table
    now = _clock_param(dialect)
    dml = (
        update(table)
        .where(
            table.c.job_id == _bind(table, "job_id"),
            fence.in_state(table, State.QUEUED),
            table.c.attempts == bindparam("r_previous", type_=table.c.attempts.type),
            or_(table.c.next_retry_at.is_(None), table.c.next_retry_at <= now),
            # Past its expiry a queued run is not claimed; the refused claim expires it.
            or_(table.c.expires_at.is_(None), table.c.expires_at > now),
        )
        .values(
            state=State.RUNNING.value,
            attempts=_bind(table, "attempts"),
            started_at=now,
            heartbeat_at=now,
            next_retry_at=None,
            worker=_bind(table, "worker"),
            updated_at=now,
            claim_token=_bind(table, "claim_token"),
            attempted_at=now,
        )
        .returning(*table.c)
    )
    return _plan(dialect, dml, with_outbox=False, journaled=Journaled.ROW)


@cache
def finish(spec: RunTable, dialect: str, success: bool) -> Plan:
    """Transition.SUCCEED (``success``) or FAIL of the attempt the fence holds."""
    table = spec.table
    now = _clock_param(dialect)
    dml = (
        update(table)
        .where(*_fence_params(table))
        .values(
            state=_bind(table, "state"),
            outcome=_bind(table, "outcome"),
            last_error=_bind(table, "last_error"),
            result=_bind(table, "result"),
            finished_at=now,
            updated_at=now,
            next_retry_at=None,
        )
        .returning(
            table.c.job_id,
            table.c.updated_at,
            table.c.attempts,
            table.c.attempted_at,
            table.c.worker,
            table.c.workflow_id,
        )
    )
    journaled = Journaled.EVENT_UNLESS_ROW if success else Journaled.CLAIM_AND_EVENT
    return _plan(dialect, dml, with_outbox=False, journaled=journaled)


@cache
def requeue(spec: RunTable, dialect: str) -> Plan:
    """Transition.RETRY or SNOOZE: the held attempt back to queued, with the next
    attempt's outbox row."""
    table = spec.table
    now = _clock_param(dialect)
    due = _bind(table, "next_retry_at")
    if dialect == "postgresql":
        due = func.coalesce(due, now + _delay_param())
    dml = (
        update(table)
        .where(*_fence_params(table))
        .values(
            state=State.QUEUED.value,
            next_retry_at=due,
            last_error=_bind(table, "last_error"),
            heartbeat_at=None,
            updated_at=now,
            max_attempts=table.c.max_attempts + bindparam("r_refund", type_=Integer()),
        )
        .returning(*table.c)
    )
    return _plan(dialect, dml, with_outbox=True, journaled=Journaled.CLAIM_AND_EVENT)


@cache
def heartbeat(spec: RunTable, dialect: str) -> Any:
    """The heartbeat: ``heartbeat_at`` stamped under the fence; no row means a lost lease."""
    table = spec.table
    return update(table).where(*_fence_params(table)).values(heartbeat_at=_clock_param(dialect))


# ---------------------------------------------------------------- the reaper's


def stale_runs(
    spec: RunTable, *, cutoff: datetime, limit: int, skip: Collection[uuid.UUID] = ()
) -> Any:
    """Running rows whose heartbeat is older than ``cutoff``, oldest first, locked
    (``ix_<table>_running_heartbeat``); ``skip`` names runs a pass found blocked."""
    table = spec.table
    return (
        select(table)
        .where(
            table.c.state == State.RUNNING.value,
            table.c.heartbeat_at < cutoff,
            table.c.job_id.not_in(list(skip)),
        )
        .order_by(table.c.heartbeat_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )


def reap(
    spec: RunTable,
    keys: Sequence[tuple[uuid.UUID, int]],
    *,
    requeue_them: bool,
    cutoff: datetime,
    reason: str,
    now: datetime,
) -> Any:
    """Transition.REAP_REQUEUE (``requeue_them``) or REAP_FAIL of the runs ``keys`` (job
    id, attempt) still running with a heartbeat still stale, one statement for the batch."""
    table = spec.table
    values: dict[str, Any] = {"updated_at": now, "last_error": reason, "heartbeat_at": None}
    if requeue_them:
        values |= {
            "state": State.QUEUED.value,
            "next_retry_at": None,
            "rescues": table.c.rescues + 1,
        }
    else:
        asked = table.c.cancel_requested_at.is_not(None)
        outcome = case((asked, Outcome.CANCELLED.value), else_=Outcome.STALE.value)
        values |= {"state": State.FAILED.value, "outcome": outcome, "finished_at": now}
    return (
        update(table)
        .where(
            table.c.state == State.RUNNING.value,
            table.c.heartbeat_at < cutoff,
            tuple_(table.c.job_id, table.c.attempts).in_(list(keys)),
        )
        .values(**values)
        .returning(
            table.c.job_id,
            table.c.attempts,
            table.c.attempted_at,
            table.c.worker,
            table.c.workflow_id,
        )
    )


# ---------------------------------------------------------------- the relay's


def unpaused(default_queue: str) -> Any:
    """Rows of a paused queue or domain wait in the outbox (docs/flow-control.md)."""
    return not_paused(OUTBOX.c.module, OUTBOX.c.queue, default_queue)


def _level(t: Any) -> tuple[Any, Any, Any]:
    """A pending row's level: its domain, its queue ('' for the app's default), its
    priority; the key of PostgreSQL's ``ix_outbox_pending_level`` (migration 0019)."""
    return t.c.module, func.coalesce(t.c.queue, literal_column("''")), t.c.priority


def _is_pending(t: Any) -> Any:
    # Spelled as the partial indexes' predicate, so the planner may use them.
    return t.c.published_at.is_(None) & t.c.dead_at.is_(None)


def _due(t: Any, now: datetime) -> tuple[Any, Any]:
    return _is_pending(t), t.c.available_at <= now


def _serving_order(t: Any, lowest_first: bool) -> tuple[Any, ...]:
    """By priority as the broker serves it, then the longest due first, then the first
    written (a batch enqueued in one transaction is due at one instant)."""
    by_priority = t.c.priority.asc() if lowest_first else t.c.priority.desc()
    return by_priority, *_by_due(t)


def _by_due(t: Any) -> tuple[Any, Any]:
    return t.c.available_at, t.c.id


def _first_of_level_after(after: Any | None) -> Any:
    """The id of the first pending row of the next level after ``after`` (a row of the
    levels): one probe of the level index, however many rows a level holds."""
    inner = OUTBOX.alias("next_level")
    stmt = select(inner.c.id).where(_is_pending(inner))
    if after is not None:
        stmt = stmt.where(
            tuple_(*_level(inner)) > tuple_(after.c.module, after.c.q, after.c.priority)
        )
    return stmt.order_by(*_level(inner)).limit(1).scalar_subquery()


def _open_levels(default_queue: str) -> Any:
    """Every level holding pending rows whose queue and domain are not paused: a skip
    scan of the level index (one probe per level), the pauses checked once per level."""
    head = OUTBOX.alias("head")
    columns = [c.label(n) for c, n in zip(_level(head), ("module", "q", "priority"), strict=True)]
    first = select(*columns).where(head.c.id == _first_of_level_after(None))
    levels = first.cte("levels", recursive=True)
    seen = levels.alias("seen")
    step = select(*columns).join_from(seen, head, head.c.id == _first_of_level_after(seen))
    levels = levels.union_all(step)
    queue = func.nullif(levels.c.q, literal_column("''"))
    return select(levels).where(not_paused(levels.c.module, queue, default_queue))


def due_firsts(now: datetime, limit: int, default_queue: str, lowest_first: bool) -> Any:
    """The relay's pick on PostgreSQL, first: the ids of the first ``limit`` due rows of
    the open levels, in the broker's order:
    each open level gives its longest due (a LATERAL range scan of the level index)."""
    levels = _open_levels(default_queue).subquery("open_levels")
    row = OUTBOX.alias("due_row")
    in_level = (
        a == b
        for a, b in zip(_level(row), (levels.c.module, levels.c.q, levels.c.priority), strict=True)
    )
    each = (
        select(row.c.id, row.c.priority, row.c.available_at)
        .where(*in_level, *_due(row, now))
        .order_by(*_by_due(row))
        .limit(limit)
        .lateral("due_of_level")
    )
    return (
        select(each.c.id)
        .select_from(levels.join(each, true()))
        .order_by(*_serving_order(each, lowest_first))
        .limit(limit)
    )


def due_rows(
    dialect: str,
    *,
    now: datetime,
    limit: int,
    default_queue: str,
    lowest_first: bool,
    ids: Sequence[int] = (),
) -> Any:
    """The relay's pick of due rows, locked (SKIP LOCKED: another relay has them): on
    PostgreSQL the ``ids`` ``due_firsts`` found, re-checked in a spelling no partial index
    of the pending rows matches (a planner without statistics, a backlog written since the
    last ANALYZE, would otherwise walk such an index, paused rows and all); on SQLite (one
    host, no LATERAL) one walk of the due rows, each checked for pauses."""
    if dialect == "postgresql":
        where: tuple[Any, ...] = (
            OUTBOX.c.id.in_(list(ids)),
            func.coalesce(OUTBOX.c.published_at, OUTBOX.c.dead_at).is_(None),
            OUTBOX.c.available_at <= now,
        )
    else:
        where = (unpaused(default_queue), *_due(OUTBOX, now))
    return (
        select(OUTBOX)
        .where(*where)
        .order_by(*_serving_order(OUTBOX, lowest_first))
        .limit(limit)
        .with_for_update(skip_locked=True)
    )


def _marks() -> Any:
    """The accepted rows as a table: ``unnest`` of three arrays bound once per statement."""
    arrays = (
        bindparam("m_ids", type_=ARRAY(BigInteger)),
        bindparam("m_counts", type_=ARRAY(Integer)),
        bindparam("m_waits", type_=ARRAY(Interval())),
    )
    return func.unnest(*arrays).table_valued("id", "seen", "wait").render_derived()


def _mark(seen: Any, published_at: Any, next_check: Any, *where: Any) -> Any:
    # Guarded by the count the publish saw: a mark that comes after another publish of the
    # same row was recorded (a relay that went first) changes nothing.
    return (
        update(OUTBOX)
        .where(*where, OUTBOX.c.publish_count == seen, LIVE)
        .values(
            published_at=published_at,
            publish_count=OUTBOX.c.publish_count + 1,
            available_at=next_check,
        )
    )


_MARKS = _marks()
# The relay's and the producer's mark of rows sent (mark sent), guarded by the count
# seen. PostgreSQL: published and checked on the database's clock, at the mark (after the publish);
# a countdown message cannot be claimed before its row is due, so its check counts from then.
_PG_NOW = func.statement_timestamp()
MARK_SENT_MANY = _mark(
    _MARKS.c.seen,
    _PG_NOW,
    func.greatest(OUTBOX.c.available_at, _PG_NOW) + _MARKS.c.wait,
    OUTBOX.c.id == _MARKS.c.id,
)
# SQLite's clock is this host's (``lease.database_now``): both times come bound.
MARK_SENT_ONE = _mark(
    bindparam("m_seen"),
    bindparam("m_now", type_=OUTBOX.c.published_at.type),
    bindparam("m_next_check", type_=OUTBOX.c.available_at.type),
    OUTBOX.c.id == bindparam("m_id"),
)
