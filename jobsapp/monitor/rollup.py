"""Counters and histograms for /metrics, rolled up from the journal by beat.

Where the numbers live: workers, beat and web are separate processes, often on separate
hosts, and /metrics is scraped from web. Every transition is already in the journal, so
beat (the singleton) reads it after cursors, in bounded pages, and adds it to
``metric_totals``: a worker pays nothing per job for its metrics, every process's work is
counted once, and a scrape reads a few rows. Two cursors: the ``job_events`` id, and per
run table the ``finished_at`` of succeeded rows that carry their claim and success
(journal/row_events.py; such a success and its claim have no event row). A success kept
as event rows at its rerun after its row was counted says so (``row_events.COUNTED``) and
is not counted again. The price is lag: numbers move once per rollup tick, and a
transition whose transaction commits more than ``SETTLE`` after it was stamped is not
counted (the journal itself stays right).

The same pages keep ``run_counts`` and ``workflow_counts``, the finished runs and
workflows by state (journal/finished_counts.py), after a ``finished_at`` cursor of their
own per run table. Those counts must not miss a late commit (retention would later take
off a run never counted), so that cursor also stays behind the oldest open transaction.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Table, and_, column, delete, func, select, table, update

from jobsapp.lifecycle.journal import (
    EVENTS,
    OUTBOX,
    add_to_values,
    finished_counts,
    registry,
    upsert,
)
from jobsapp.lifecycle.journal.outbox_queries import COUNTERS, bump
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.row_events import COUNTED, finish_cursor, move_finish_cursor
from jobsapp.lifecycle.journal.tables import ChartMinute
from jobsapp.lifecycle.journal.totals import TOTALS, Key, add
from jobsapp.lifecycle.rules.states import TERMINAL_STATES, State, Transition
from jobsapp.maintenance import budget, lease

log = logging.getLogger(__name__)

ATTEMPTS, REAPED = "attempts", "reaped"
QUEUE_WAIT, RUN_DURATION = "queue_wait", "run_duration"
# The charts' series of finished runs by the terminal state they entered.
FINISHED = "finished"
# The charts' series of enqueues: first attempts' outbox rows, after their own id cursor.
ENQUEUED = "enqueued"
# The charts' series of failed attempts by error code (the label, cut to its column).
FAILURES = "failures"
FAILED_TRANSITIONS = (Transition.FAIL.value, Transition.RETRY.value, Transition.REAP_FAIL.value)
_CODE = re.compile(r"([A-Za-z_][\w.]*)\s*:")
_LABEL = 32
OUTBOX_CURSOR = "charts_outbox_cursor"
HISTOGRAMS = (QUEUE_WAIT, RUN_DURATION)
# Upper bounds in seconds: from a hot queue's sub-second wait to an hour-long render.
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
INF = "+Inf"
SUM_MS = "sum_ms"
UNKNOWN_TASK = "unknown"
CURSOR = "metrics_event_cursor"
SETTLE = timedelta(seconds=10)
# How long the oldest open transaction may hold the finish counts back; a finish that
# commits later than that after its transaction began is not counted.
HOLD = timedelta(minutes=10)
_MICRO = timedelta(microseconds=1)
_ACTIVITY = table("pg_stat_activity", column("datname"), column("pid"), column("xact_start"))
BATCH = 2000
# A series' count: (minute, metric, module, task, label).
MinuteKey = tuple[datetime, str, str, str, str]
SERIES: Table = ChartMinute.__table__  # type: ignore[assignment]
# The charts' longest window (a day) and a day to spare.
KEEP_MINUTES = timedelta(days=2)
_MINUTE = timedelta(minutes=1)

# The transitions that end an attempt, and the outcome label each counts under; a cancel
# ends one only when it leaves a running run (``ending``).
CANCELLED = "cancelled"
ENDINGS = {
    Transition.SUCCEED.value: "succeeded",
    Transition.RETRY.value: "retried",
    Transition.SNOOZE.value: "snoozed",
    Transition.FAIL.value: "failed",
    Transition.REAP_REQUEUE.value: "reaped",
    Transition.REAP_FAIL.value: "reaped",
    Transition.CANCEL.value: CANCELLED,
}
REAPS = {Transition.REAP_REQUEUE.value: "requeued", Transition.REAP_FAIL.value: "failed"}

Attempt = tuple[uuid.UUID, int]
# An attempt's outbox row: when it was written, and when it was last handed to the broker.
Sent = tuple[datetime, datetime | None]


@dataclass(frozen=True)
class Event:
    id: int
    module: str
    job_id: uuid.UUID
    attempt: int
    transition: str
    at: datetime
    # Kept at a rerun after the rollup counted it from the run row.
    counted: bool = False
    # A failed attempt's error code (``error_code``); None for the other transitions.
    code: str | None = None
    from_state: str | None = None


def ending(e: Event) -> str | None:
    """The outcome label of the attempt ``e`` ended; None when it ended none (a claim, or
    the cancel of a queued run, whose last attempt, if any, already counted its end)."""
    if e.transition == Transition.CANCEL.value and e.from_state != State.RUNNING.value:
        return None
    return ENDINGS.get(e.transition)


def error_code(reason: str | None, detail: Mapping[str, Any] | None) -> str:
    """A failure's code: the exception type stored with the attempt, else the word before
    the first colon of its error (``storage_unavailable:``), else ``other`` (pure)."""
    if isinstance(detail, Mapping) and detail.get("type"):
        return str(detail["type"]).rsplit(".", 1)[-1][:_LABEL]
    found = _CODE.match(reason or "")
    return found[1][:_LABEL] if found else "other"


def failures_by_minute(
    events: Iterable[Event], tasks: Mapping[uuid.UUID, str]
) -> Counter[MinuteKey]:
    """Failed attempts by the minute they failed, their task and error code (pure)."""
    return Counter(
        (minute_of(e.at), FAILURES, e.module, tasks.get(e.job_id, UNKNOWN_TASK), e.code)
        for e in events
        if e.code is not None
    )


def bucket_label(seconds: float) -> str:
    return next((_le(b) for b in BUCKETS if seconds <= b), INF)


def _le(bound: float) -> str:
    return f"{bound:g}"


def tally(
    events: Iterable[Event],
    tasks: Mapping[uuid.UUID, str],
    claimed_at: Mapping[Attempt, datetime],
    sent: Mapping[Attempt, Sent],
) -> Counter[Key]:
    """What ``events`` add to the totals (pure).

    Queue wait runs from the attempt's message reaching the broker to its claim: the
    backlog of the workers. A long delay (a retry's backoff) is not part of it, as the
    relay publishes such a row only when it is due; a short countdown is. Run duration
    runs from the claim to the transition that ended the attempt (a reaped run has none:
    its end is when the reaper noticed, not when it stopped; a cancelled one neither:
    its end is when a revoke stopped it, not when its work would have ended).
    """
    out: Counter[Key] = Counter()
    for e in events:
        task = tasks.get(e.job_id, UNKNOWN_TASK)
        attempt = (e.job_id, e.attempt)
        if e.transition == Transition.CLAIM.value and attempt in sent:
            _observe(out, (QUEUE_WAIT, e.module, task), e.at - _handed_over(sent[attempt], e.at))
        outcome = ending(e)
        if outcome is None:
            continue
        out[(ATTEMPTS, e.module, task, outcome)] += 1
        if e.transition in REAPS:
            out[(REAPED, e.module, task, REAPS[e.transition])] += 1
        elif outcome != CANCELLED and attempt in claimed_at:
            _observe(out, (RUN_DURATION, e.module, task), e.at - claimed_at[attempt])
    return out


def _handed_over(sent: Sent, claimed: datetime) -> datetime:
    # A publish marked after the claim (the mark follows the broker's reply) tells
    # nothing about the wait: the row's creation is the closer bound then.
    created, published = sent
    return published if published is not None and published <= claimed else created


def _observe(out: Counter[Key], series: tuple[str, str, str], took: timedelta) -> None:
    seconds = max(took.total_seconds(), 0.0)
    out[(*series, bucket_label(seconds))] += 1
    out[(*series, SUM_MS)] += round(seconds * 1000)


def by_minute(
    events: Iterable[Event],
    tasks: Mapping[uuid.UUID, str],
    claimed_at: Mapping[Attempt, datetime],
    sent: Mapping[Attempt, Sent],
) -> Counter[MinuteKey]:
    """What ``events`` add to the charts' series (pure): ``tally`` of each minute's events,
    a wait in the minute of its claim, a duration in the minute of its ending; the
    attempts by outcome and the histograms' buckets (their sums and the reaps stay in the
    totals only)."""
    return _series(_per_minute(events, tasks, claimed_at, sent))


def _per_minute(
    events: Iterable[Event],
    tasks: Mapping[uuid.UUID, str],
    claimed_at: Mapping[Attempt, datetime],
    sent: Mapping[Attempt, Sent],
) -> dict[datetime, Counter[Key]]:
    """``tally`` of each minute's events: summed, the totals' counts of them all."""
    minutes: dict[datetime, list[Event]] = {}
    for e in events:
        minutes.setdefault(minute_of(e.at), []).append(e)
    return {minute: tally(group, tasks, claimed_at, sent) for minute, group in minutes.items()}


def _series(per_minute: Mapping[datetime, Counter[Key]]) -> Counter[MinuteKey]:
    out: Counter[MinuteKey] = Counter()
    for minute, counts in per_minute.items():
        for key, value in counts.items():
            if key[0] in (ATTEMPTS, *HISTOGRAMS) and key[3] != SUM_MS:
                out[(minute, *key)] += value
    return out


def _add_events(
    conn: Connection,
    events: Iterable[Event],
    tasks: Mapping[uuid.UUID, str],
    claimed_at: Mapping[Attempt, datetime],
    sent: Mapping[Attempt, Sent],
) -> None:
    """``events`` into the totals and the charts' series, tallied once."""
    per_minute = _per_minute(events, tasks, claimed_at, sent)
    series = _series(per_minute) + failures_by_minute(events, tasks)
    _add_counts(conn, sum(per_minute.values(), Counter()), series)


def finished_by_minute(module: str, rows: Iterable[Mapping[str, Any]]) -> Counter[MinuteKey]:
    """Finished runs by the minute they finished, their task and terminal state (pure)."""
    return Counter(
        (minute_of(r["finished_at"]), FINISHED, module, r["task_name"], r["state"]) for r in rows
    )


def minute_of(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def _add_counts(conn: Connection, counts: Counter[Key], series: Counter[MinuteKey]) -> None:
    add(conn, counts)
    rows = [
        {"minute": m, "metric": k, "module": mod, "task": t, "label": lab, "value": v}
        for (m, k, mod, t, lab), v in series.items()
        if v
    ]
    add_to_values(conn, SERIES, rows)


def settled(events: Sequence[Event], horizon: datetime) -> list[Event]:
    """The events before the first one newer than ``horizon``: a younger one may still
    have older ids committing behind it, and the cursor must not pass those."""
    for i, event in enumerate(events):
        if event.at > horizon:
            return list(events[:i])
    return list(events)


# ------------------------------------------------------------------ the pass


def run_once(engine: Engine, batch: int = BATCH, settle: timedelta = SETTLE) -> int:
    """Roll up page after page (one transaction each) until every page came back short
    (caught up) or the pass's time budget is spent; returns how many transitions and
    finished runs were counted (0: caught up). One page a tick capped the rollup at
    ``BATCH`` successes per 15 s (about 133 a second), below a busy journal's rate."""
    spent = budget.for_pass(budget.DEFAULT_BUDGET)
    _drop_old_minutes(engine)
    total = 0
    while True:
        counted, full = _roll_page(engine, batch, settle)
        total += counted
        if not full or not spent.allows_more():
            return total


def _drop_old_minutes(engine: Engine) -> None:
    """The charts' minutes older than ``KEEP_MINUTES``: a range of the primary key."""
    with engine.begin() as conn:
        cutoff = lease.database_now(conn) - KEEP_MINUTES
        conn.execute(delete(SERIES).where(SERIES.c.minute < cutoff))


def counted_through(conn: Connection) -> datetime | None:
    """The newest minute the charts' series holds (the rollup's reach, when busy)."""
    newest: datetime | None = conn.execute(select(func.max(SERIES.c.minute))).scalar()
    return None if newest is None else newest + _MINUTE


def _roll_page(engine: Engine, batch: int, settle: timedelta) -> tuple[int, bool]:
    """One page of events and one page of succeeded rows per run table: how many
    transitions were counted, and whether any page was full (more may be waiting)."""
    with engine.begin() as conn:
        horizon = lease.database_now(conn) - settle
        pages = [_roll_successes(conn, spec, horizon, batch) for spec in registry.all_tables()]
        counted = sum(n for n, _ in pages)
        finishes = _finish_horizon(conn, horizon)
        ended = [_roll_finished(conn, spec, finishes, batch) for spec in registry.all_tables()]
        counted += sum(n for n, _ in ended)
        enqueued, more = _roll_enqueues(conn, horizon, batch)
        counted += enqueued
        full = any(f for _, f in pages) or any(f for _, f in ended) or more
        cursor = _locked_cursor(conn)
        read = _events_after(conn, cursor, batch)
        events = settled(read, horizon)
        if not events:
            _rewind_if_ids_restarted(conn, cursor)
            return counted, full
        fresh = [e for e in events if not e.counted]
        found = _lookups(conn, fresh)
        _add_events(conn, fresh, *found)
        bump(conn, CURSOR, events[-1].id - cursor)
    return counted + len(fresh), full or len(read) == batch


def _roll_enqueues(conn: Connection, horizon: datetime, batch: int) -> tuple[int, bool]:
    """The outbox rows of first attempts written after ``OUTBOX_CURSOR`` (an id) and
    settled by ``horizon`` (``settled``'s rule), each an enqueue in the minute it was
    written: every enqueue writes one, carried on its run row or not. Also whether the
    page was full."""
    o = OUTBOX.c
    cursor = _locked_cursor(conn, OUTBOX_CURSOR)
    read = conn.execute(
        select(o.id, o.module, o.task_name, o.attempt, o.created_at)
        .where(o.id > cursor)
        .order_by(o.id)
        .limit(batch)
    ).all()
    rows = next((read[:i] for i, r in enumerate(read) if r.created_at > horizon), read)
    if not rows:
        return 0, False
    firsts = [r for r in rows if r.attempt == 1]
    series = Counter((minute_of(r.created_at), ENQUEUED, r.module, r.task_name, "") for r in firsts)
    _add_counts(conn, Counter(), series)
    bump(conn, OUTBOX_CURSOR, rows[-1].id - cursor)
    return len(firsts), len(read) == batch


def _roll_successes(
    conn: Connection, spec: RunTable, horizon: datetime, batch: int
) -> tuple[int, bool]:
    """The successes ``spec``'s rows carry, finished after the table's cursor and by
    ``horizon``; each counts as its claim and its success would as events. Also whether
    the page was full. The row carries its task and claim, its attempt's outbox row
    (joined by its unique key) the wait: one statement, no lookups per page."""
    through = finish_cursor(conn, spec.module)
    if through is None:
        return 0, False
    t = spec.table
    sent = and_(
        OUTBOX.c.module == spec.module,
        OUTBOX.c.job_id == t.c.job_id,
        OUTBOX.c.attempt == t.c.attempts,
    )
    page = conn.execute(
        select(
            t.c.job_id,
            t.c.task_name,
            t.c.attempts,
            t.c.attempted_at,
            t.c.finished_at,
            OUTBOX.c.created_at,
            OUTBOX.c.published_at,
        )
        .select_from(t.outerjoin(OUTBOX, sent))
        .where(
            t.c.finished_at > through,
            t.c.finished_at <= horizon,
            t.c.state == State.SUCCEEDED.value,
            t.c.attempted_at.is_not(None),
        )
        .order_by(t.c.finished_at)
        .limit(batch)
    ).all()
    rows = _whole_instants(page, batch)
    if not rows:
        return 0, False
    events = [
        Event(0, spec.module, r.job_id, r.attempts, kind.value, at)
        for r in rows
        for kind, at in ((Transition.CLAIM, r.attempted_at), (Transition.SUCCEED, r.finished_at))
    ]
    tasks = {r.job_id: r.task_name for r in rows}
    claims = {(r.job_id, r.attempts): r.attempted_at for r in rows}
    handed = {
        (r.job_id, r.attempts): (r.created_at, r.published_at)
        for r in rows
        if r.created_at is not None
    }
    _add_events(conn, events, tasks, claims, handed)
    move_finish_cursor(conn, spec.module, rows[-1].finished_at)
    return len(events), len(page) == batch


def _roll_finished(
    conn: Connection, spec: RunTable, horizon: datetime, batch: int
) -> tuple[int, bool]:
    """Add the runs of ``spec`` that entered a terminal state after the table's count
    cursor and by ``horizon`` to ``run_counts``, and the workflows they finished to
    ``workflow_counts`` (finished_counts.py); how many, and whether the page was full."""
    through = finished_counts.counting(conn, spec.module)
    if through is None:
        return 0, False
    t = spec.table
    page = conn.execute(
        select(*finished_counts.columns(spec))
        .where(
            t.c.finished_at > through,
            t.c.finished_at <= horizon,
            t.c.state.in_(TERMINAL_STATES),
        )
        .order_by(t.c.finished_at)
        .limit(batch)
    ).all()
    rows = _whole_instants(page, batch)
    if rows:
        counted = [r._mapping for r in rows]
        finished_counts.add(conn, Counter(finished_counts.key_of(spec.module, r) for r in counted))
        finished_counts.count_workflows(conn, spec.module, counted)
        finished_counts.counted(conn, spec.module, rows[-1].finished_at)
        _add_counts(conn, Counter(), finished_by_minute(spec.module, counted))
    return len(rows), len(page) == batch


def _finish_horizon(conn: Connection, horizon: datetime) -> datetime:
    """``horizon``, or just before the oldest open transaction's start if earlier (up to
    ``HOLD``): on PostgreSQL a finish stamps ``finished_at`` with its transaction's start,
    so no run finished before that can still commit behind the cursor and be missed (a
    missed run would later be taken off by retention without having been counted)."""
    if conn.dialect.name != "postgresql":
        return horizon
    oldest: datetime | None = conn.execute(
        select(func.min(_ACTIVITY.c.xact_start)).where(
            _ACTIVITY.c.datname == func.current_database(),
            _ACTIVITY.c.pid != func.pg_backend_pid(),
        )
    ).scalar()
    if oldest is None:
        return horizon
    return max(min(horizon, oldest - _MICRO), horizon - HOLD)


def _whole_instants(rows: Sequence[Any], batch: int) -> Sequence[Any]:
    """A full page without the rows of its last instant (the next page starts there), so
    the cursor never passes rows of one ``finished_at`` it did not count; unless the page
    is that one instant."""
    if len(rows) < batch:
        return rows
    whole = [r for r in rows if r.finished_at < rows[-1].finished_at]
    return whole or rows


def _locked_cursor(conn: Connection, name: str = CURSOR) -> int:
    """The last id counted (of events, or of the outbox under ``OUTBOX_CURSOR``); locked
    so that a second beat's pass waits, not doubles."""
    conn.execute(upsert(conn, COUNTERS).values(name=name, value=0).on_conflict_do_nothing())
    stmt = select(COUNTERS.c.value).where(COUNTERS.c.name == name)
    if conn.dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    return int(conn.execute(stmt).scalar_one())


def _events_after(conn: Connection, cursor: int, batch: int) -> list[Event]:
    cols = EVENTS.c
    rows = conn.execute(
        select(
            cols.id,
            cols.module,
            cols.job_id,
            cols.attempt,
            cols.transition,
            cols.at,
            cols.reason,
            cols.detail,
            cols.from_state,
        )
        .where(cols.id > cursor)
        .order_by(cols.id)
        .limit(batch)
    )
    return [
        Event(
            i,
            module,
            job_id,
            attempt,
            transition,
            at,
            reason == COUNTED,
            error_code(reason, detail) if transition in FAILED_TRANSITIONS else None,
            from_state,
        )
        for i, module, job_id, attempt, transition, at, reason, detail, from_state in rows
    ]


def _rewind_if_ids_restarted(conn: Connection, cursor: int) -> None:
    # SQLite hands out ids from the highest one left: once retention empties the table
    # they start again below the cursor.
    highest = conn.execute(select(func.max(EVENTS.c.id))).scalar()
    if cursor and (highest or 0) < cursor:
        conn.execute(update(COUNTERS).where(COUNTERS.c.name == CURSOR).values(value=highest or 0))


def _lookups(
    conn: Connection, events: Sequence[Event]
) -> tuple[dict[uuid.UUID, str], dict[Attempt, datetime], dict[Attempt, Sent]]:
    """Task names, claim times and due times of the page's jobs (by primary key or index)."""
    tasks: dict[uuid.UUID, str] = {}
    claimed: dict[Attempt, datetime] = {}
    due: dict[Attempt, Sent] = {}
    for module in {e.module for e in events}:
        ids = list({e.job_id for e in events if e.module == module})
        tasks.update(_task_names(conn, module, ids))
        claimed.update(_claims(conn, module, ids))
        due.update(_sent_times(conn, module, ids))
    return tasks, claimed, due


def _task_names(conn: Connection, module: str, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    # A module whose code this process does not import counts under UNKNOWN_TASK.
    tables = {spec.module: spec.table for spec in registry.all_tables()}
    if module not in tables:
        return {}
    table = tables[module]
    rows = conn.execute(select(table.c.job_id, table.c.task_name).where(table.c.job_id.in_(ids)))
    return {job_id: name for job_id, name in rows}


def _claims(conn: Connection, module: str, ids: list[uuid.UUID]) -> dict[Attempt, datetime]:
    cols = EVENTS.c
    rows = conn.execute(
        select(cols.job_id, cols.attempt, cols.at).where(
            cols.module == module,
            cols.job_id.in_(ids),
            cols.transition == Transition.CLAIM.value,
        )
    )
    return {(job_id, attempt): at for job_id, attempt, at in rows}


def _sent_times(
    conn: Connection, module: str, ids: list[uuid.UUID]
) -> dict[Attempt, tuple[datetime, datetime | None]]:
    cols = OUTBOX.c
    rows = conn.execute(
        select(cols.job_id, cols.attempt, cols.created_at, cols.published_at).where(
            cols.module == module, cols.job_id.in_(ids)
        )
    )
    return {(job_id, attempt): (created, published) for job_id, attempt, created, published in rows}


def read(conn: Connection) -> dict[Key, int]:
    """Every total; the table holds a few rows per (module, task)."""
    cols = TOTALS.c
    rows = conn.execute(select(cols.metric, cols.module, cols.task, cols.label, cols.value))
    return {(m, mod, t, lab): int(v) for m, mod, t, lab, v in rows}
