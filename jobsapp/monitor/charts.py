"""The charts page: throughput, waits and failures over the last hour or day.

``metric_totals`` (``monitor.rollup``) holds running totals with no time axis: it gives
the distributions since the totals began (histogram buckets), read as they are. The
attempts ended by outcome and the percentiles of the window come from ``chart_minutes``,
the series the same rollup keeps per minute, module and task (its primary key starts
with the minute): the rows read are bounded by the window's minutes, not by the journal;
what the rollup has not reached yet is said (``counted_through``), not shown as zero. A
percentile is the upper bound of the histogram bucket it falls in (``rollup.BUCKETS``).
The enqueues come from the same series (the rollup counts first attempts' outbox rows),
and so do the finished runs by task and the failed attempts by error code; the active
runs are counted live (up to ``summary.ACTIVE_CAP`` per module and state).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, func, select

from jobsapp.db import utcnow
from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.journal.totals import Key
from jobsapp.lifecycle.rules.states import ACTIVE_STATES, ALL_STATES
from jobsapp.monitor import rollup, summary

# The window, its bucket width.
WINDOWS = {
    "hour": (timedelta(hours=1), timedelta(minutes=1)),
    "day": (timedelta(days=1), timedelta(minutes=15)),
}
OUTCOMES = ("succeeded", "retried", "snoozed", "failed", "reaped", "cancelled")
PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class Series:
    start: datetime
    step: timedelta
    # Per bucket, the count of each outcome (and enqueued).
    buckets: list[dict[str, int]]

    @property
    def peak(self) -> int:
        return max(
            (sum(v for k, v in b.items() if k != "enqueued") for b in self.buckets), default=0
        )


@dataclass(frozen=True)
class Charts:
    window: str
    throughput: Series
    # Seconds at each percentile, per histogram (queue_wait, run_duration); None: no sample.
    percentiles: dict[str, dict[int, float | None]]
    failures: list[tuple[str, int]]
    # All-time distributions from metric_totals: histogram -> [(bucket label, count)].
    distributions: dict[str, list[tuple[str, int]]]
    # Per task, the runs of the window by the state they ended (or wait) in, busiest first.
    by_task: list[TaskLine]
    # The end of the newest minute the rollup has counted; the series is empty after it.
    counted_through: datetime | None = None


@dataclass(frozen=True)
class TaskLine:
    module: str
    task: str
    states: dict[str, int]
    # Active states of the module with more than ``summary.ACTIVE_CAP`` runs in the window:
    # their counts are those of the oldest ``ACTIVE_CAP`` (at least that many).
    capped: frozenset[str] = frozenset()

    @property
    def total(self) -> int:
        return sum(self.states.values())


def charts(engine: Engine, window: str, now: datetime | None = None) -> Charts:
    span, step = WINDOWS[window]
    now = now or utcnow()
    start = _floor(now - span, step)
    with engine.connect() as conn:
        series = Series(start, step, throughput(conn, start, step, now))
        through = rollup.counted_through(conn)
        waits = percentiles(conn, start)
        failures = failures_by_code(conn, start)
        totals = rollup.read(conn)
        tasks = by_task(conn, start)
    return Charts(window, series, waits, failures, distributions(totals), tasks, through)


def by_task(conn: Connection, start: datetime) -> list[TaskLine]:
    """The runs each task finished in the window by terminal state (the rollup's series),
    and the runs in an active state that got there in the window (``updated_at`` since
    ``start``, on ``ix_<table>_state_updated``: up to ``summary.ACTIVE_CAP`` of each)."""
    found: dict[tuple[str, str], dict[str, int]] = {}
    capped: dict[str, set[str]] = {}

    def count(module: str, task: str, state: str, n: int) -> None:
        line = found.setdefault((module, str(task)), dict.fromkeys(ALL_STATES, 0))
        line[state] += int(n)

    s = rollup.SERIES.c
    finished = (
        select(s.module, s.task, s.label, func.sum(s.value))
        .where(s.minute >= start, s.metric == rollup.FINISHED)
        .group_by(s.module, s.task, s.label)
    )
    for module, task, state, n in conn.execute(finished):
        if state in ALL_STATES:
            count(module, task, state, n)
    for spec in registry.all_tables():
        for state in ACTIVE_STATES:
            rows = summary.oldest_active(spec.table, state, "task_name", since=start)
            read = conn.execute(select(rows.c.task_name, func.count()).group_by(rows.c.task_name))
            per_task = read.all()
            for task, n in per_task:
                count(spec.module, task, state, n)
            if sum(n for _, n in per_task) >= summary.ACTIVE_CAP:
                capped.setdefault(spec.module, set()).add(state)
    lines = [
        TaskLine(module, task, states, frozenset(capped.get(module, ())))
        for (module, task), states in found.items()
    ]
    return sorted(lines, key=lambda line: (-line.total, line.module, line.task))


def _floor(at: datetime, step: timedelta) -> datetime:
    seconds = int(step.total_seconds())
    return datetime.fromtimestamp(int(at.timestamp()) // seconds * seconds, tz=at.tzinfo)


def throughput(
    conn: Connection, start: datetime, step: timedelta, now: datetime
) -> list[dict[str, int]]:
    """Per bucket, the attempts ended by outcome and the enqueues: the rollup's series,
    ``chart_minutes``, through its primary key."""
    n = int((now - start) / step) + 1
    out: list[dict[str, int]] = [dict.fromkeys((*OUTCOMES, "enqueued"), 0) for _ in range(n)]
    s = rollup.SERIES.c
    stmt = (
        select(s.minute, s.metric, s.label, func.sum(s.value))
        .where(s.minute >= start, s.metric.in_([rollup.ATTEMPTS, rollup.ENQUEUED]))
        .group_by(s.minute, s.metric, s.label)
    )
    for minute, metric, label, count in conn.execute(stmt):
        index = int((minute - start) / step)
        column = "enqueued" if metric == rollup.ENQUEUED else label
        if 0 <= index < n and column in out[index]:
            out[index][column] += int(count)
    return out


def percentiles(conn: Connection, start: datetime) -> dict[str, dict[int, float | None]]:
    """Queue wait and run duration of the window's attempts (``rollup.tally``'s rules),
    from the series' histogram buckets: each percentile is the upper bound of the bucket
    it falls in (a wait past the last bound shows that bound)."""
    s = rollup.SERIES.c
    rows = conn.execute(
        select(s.metric, s.label, func.sum(s.value))
        .where(s.minute >= start, s.metric.in_(rollup.HISTOGRAMS))
        .group_by(s.metric, s.label)
    )
    counts: dict[str, dict[str, int]] = {h: {} for h in rollup.HISTOGRAMS}
    for metric, label, count in rows:
        counts[metric][label] = int(count)
    return {h: ranks(counts[h]) for h in rollup.HISTOGRAMS}


def ranks(buckets: Mapping[str, int]) -> dict[int, float | None]:
    """Each percentile's bucket bound, from bucket counts by label (pure)."""
    bounds = [*rollup.BUCKETS, rollup.BUCKETS[-1]]
    counts = [buckets.get(label, 0) for label in _labels()]
    total = sum(counts)
    if not total:
        return dict.fromkeys(PERCENTILES)
    out: dict[int, float | None] = {}
    for p in PERCENTILES:
        rank, seen = p / 100 * total, 0
        for bound, count in zip(bounds, counts, strict=True):
            seen += count
            if seen >= rank and count:
                out[p] = bound
                break
    return out


def failures_by_code(conn: Connection, start: datetime) -> list[tuple[str, int]]:
    """Failed attempts of the window by error code (``rollup.error_code``), most first:
    the rollup's series."""
    s = rollup.SERIES.c
    total = func.sum(s.value)
    rows = conn.execute(
        select(s.label, total)
        .where(s.minute >= start, s.metric == rollup.FAILURES)
        .group_by(s.label)
        .order_by(total.desc(), s.label)
    )
    return [(code, int(n)) for code, n in rows]


def distributions(totals: Mapping[Key, int]) -> dict[str, list[tuple[str, int]]]:
    """Each histogram's bucket counts (not cumulative), summed over modules and tasks."""
    out: dict[str, list[tuple[str, int]]] = {}
    for histogram in rollup.HISTOGRAMS:
        by_label = Counter({label: 0 for label in _labels()})
        for (metric, _module, _task, label), value in totals.items():
            if metric == histogram and label != rollup.SUM_MS:
                by_label[label] += value
        out[histogram] = [(label, by_label[label]) for label in _labels()]
    return out


def _labels() -> list[str]:
    return [rollup.bucket_label(b) for b in rollup.BUCKETS] + [rollup.INF]
