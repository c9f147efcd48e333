"""The charts page: throughput, waits and failures over the last hour or day.

``metric_totals`` (``monitor.rollup``) holds running totals with no time axis: it gives
the distributions since the totals began (histogram buckets), read as they are. A series
over time is read from the journal's events of the window (``row_events.window``: the
``job_events`` rows through their time index ``ix_job_events_at``, and the enqueues,
claims and successes the run rows carry through ``ix_<table>_state_updated``), grouped by
the database into buckets, never a scan of a table. The window's percentiles pair each
ending with its claim, newest ``SAMPLE`` endings.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Integer, and_, cast, func, select
from sqlalchemy.orm import aliased

from jobsapp.db import utcnow
from jobsapp.lifecycle.journal import EVENTS, OUTBOX, registry, row_events
from jobsapp.lifecycle.journal.totals import Key
from jobsapp.lifecycle.rules.states import ALL_STATES, Transition
from jobsapp.monitor import rollup

# The window, its bucket width.
WINDOWS = {
    "hour": (timedelta(hours=1), timedelta(minutes=1)),
    "day": (timedelta(days=1), timedelta(minutes=15)),
}
SAMPLE = 5000
OUTCOMES = ("succeeded", "retried", "snoozed", "failed", "reaped")
_FAILURES = (Transition.FAIL.value, Transition.RETRY.value, Transition.REAP_FAIL.value)
_CODE = re.compile(r"([A-Za-z_][\w.]*)\s*:")
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


@dataclass(frozen=True)
class TaskLine:
    module: str
    task: str
    states: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.states.values())


def charts(engine: Engine, window: str, now: datetime | None = None) -> Charts:
    span, step = WINDOWS[window]
    now = now or utcnow()
    start = _floor(now - span, step)
    with engine.connect() as conn:
        series = Series(start, step, throughput(conn, start, step, now))
        waits = percentiles(conn, start)
        failures = failures_by_code(conn, start)
        totals = rollup.read(conn)
        tasks = by_task(conn, start)
    return Charts(window, series, waits, failures, distributions(totals), tasks)


def by_task(conn: Connection, start: datetime) -> list[TaskLine]:
    """The runs each task touched in the window (``updated_at`` since ``start``: ended, or
    moved to the state they are in), by state: one GROUP BY per run table and state on
    ``ix_<table>_state_updated``, so a busy table is read within the window only."""
    found: dict[tuple[str, str], dict[str, int]] = {}
    for spec in registry.all_tables():
        table = spec.table
        for state in ALL_STATES:
            stmt = (
                select(table.c.task_name, func.count())
                .where(table.c.state == state, table.c.updated_at >= start)
                .group_by(table.c.task_name)
            )
            for task, count in conn.execute(stmt):
                line = found.setdefault((spec.module, str(task)), dict.fromkeys(ALL_STATES, 0))
                line[state] = int(count)
    lines = [TaskLine(module, task, states) for (module, task), states in found.items()]
    return sorted(lines, key=lambda line: (-line.total, line.module, line.task))


def _floor(at: datetime, step: timedelta) -> datetime:
    seconds = int(step.total_seconds())
    return datetime.fromtimestamp(int(at.timestamp()) // seconds * seconds, tz=at.tzinfo)


def _epoch(conn: Connection, column: Any) -> Any:
    if conn.dialect.name == "postgresql":
        return func.extract("epoch", column)
    return cast(func.strftime("%s", column), Integer)


def throughput(
    conn: Connection, start: datetime, step: timedelta, now: datetime
) -> list[dict[str, int]]:
    width = int(step.total_seconds())
    events = row_events.window(start, [*rollup.ENDINGS, Transition.ENQUEUE.value])
    bucket = func.floor((_epoch(conn, events.c.at) - int(start.timestamp())) / width)
    stmt = select(bucket, events.c.transition, func.count()).group_by(bucket, events.c.transition)
    n = int((now - start) / step) + 1
    out: list[dict[str, int]] = [dict.fromkeys((*OUTCOMES, "enqueued"), 0) for _ in range(n)]
    for index, transition, count in conn.execute(stmt):
        if 0 <= int(index) < n:
            label = rollup.ENDINGS.get(transition, "enqueued")
            out[int(index)][label] += int(count)
    return out


def percentiles(conn: Connection, start: datetime) -> dict[str, dict[int, float | None]]:
    """Run duration (claim to ending) and queue wait (enqueue or previous ending to
    claim, the time a due attempt waited) of the window's newest ``SAMPLE`` attempts."""
    e = EVENTS.c
    ends = (
        select(e.module, e.job_id, e.attempt, e.at)
        .where(
            e.at >= start,
            e.transition.in_(list(rollup.ENDINGS)),
            e.transition.not_in(list(rollup.REAPS)),
        )
        .order_by(e.at.desc())
        .limit(SAMPLE)
        .subquery()
    )
    claim = aliased(EVENTS)
    same = and_(
        claim.c.module == ends.c.module,
        claim.c.job_id == ends.c.job_id,
        claim.c.attempt == ends.c.attempt,
        claim.c.transition == Transition.CLAIM.value,
    )
    runs = conn.execute(select(claim.c.at, ends.c.at).join(claim, same)).all()
    runs = _newest([*runs, *_carried_runs(conn, start)], 1)
    waits = _queue_waits(conn, start)
    return {
        rollup.RUN_DURATION: _ranks([(e - c).total_seconds() for c, e in runs]),
        rollup.QUEUE_WAIT: _ranks(waits),
    }


def _queue_waits(conn: Connection, start: datetime) -> list[float]:
    """Claims of the window, each against when its message was handed to the broker
    (``rollup``'s rule: the publish, or the outbox row's creation)."""
    e = EVENTS.c
    claims = (
        select(e.module, e.job_id, e.attempt, e.at)
        .where(e.at >= start, e.transition == Transition.CLAIM.value)
        .order_by(e.at.desc())
        .limit(SAMPLE)
        .subquery()
    )
    rows = _with_sent(conn, claims, claims.c.module)
    rows = _newest([*rows, *_carried_claims(conn, start)], 0)
    return [
        max((at - rollup._handed_over((created, published), at)).total_seconds(), 0.0)
        for at, created, published in rows
    ]


def _carried_runs(conn: Connection, start: datetime) -> list[Any]:
    """(claim, success) of the window's newest ``SAMPLE`` successes each run table carries."""
    found: list[Any] = []
    for spec in registry.all_tables():
        t = spec.table
        found += conn.execute(
            select(t.c.attempted_at, t.c.finished_at)
            .where(row_events.carries_success(t), t.c.finished_at >= start)
            .order_by(t.c.finished_at.desc())
            .limit(SAMPLE)
        ).all()
    return found


def _carried_claims(conn: Connection, start: datetime) -> list[Any]:
    """The window's newest ``SAMPLE`` claims each run table carries, with their outbox row's
    creation and publish (as ``_queue_waits``)."""
    found: list[Any] = []
    for spec in registry.all_tables():
        t = spec.table
        claims = (
            select(t.c.job_id, t.c.attempts.label("attempt"), t.c.attempted_at.label("at"))
            .where(row_events.carries_claim(t), t.c.attempted_at >= start)
            .order_by(t.c.attempted_at.desc())
            .limit(SAMPLE)
            .subquery()
        )
        found += _with_sent(conn, claims, spec.module)
    return found


def _with_sent(conn: Connection, claims: Any, module: Any) -> list[Any]:
    """``(at, created_at, published_at)`` of a sample of claims (``job_id``, ``attempt``,
    ``at``) and their outbox rows. The sample is cut before the join: joined first, the
    whole window's claims would be, through a scan of the outbox."""
    o = OUTBOX.c
    same = and_(o.module == module, o.job_id == claims.c.job_id, o.attempt == claims.c.attempt)
    found = conn.execute(select(claims.c.at, o.created_at, o.published_at).join(OUTBOX, same)).all()
    return list(found)


def _newest(rows: Sequence[Any], at: int) -> list[Any]:
    """The ``SAMPLE`` rows newest by their column ``at``, of samples from several sources."""
    return sorted(rows, key=lambda row: row[at], reverse=True)[:SAMPLE]


def _ranks(values: Sequence[float]) -> dict[int, float | None]:
    if not values:
        return dict.fromkeys(PERCENTILES)
    ordered = sorted(values)
    last = len(ordered) - 1
    return {p: ordered[min(last, round(p / 100 * last))] for p in PERCENTILES}


def failures_by_code(conn: Connection, start: datetime) -> list[tuple[str, int]]:
    """Failed attempts of the window by error code: the exception type stored with the
    attempt, else the word before the first colon of its error (``storage_unavailable:``)."""
    rows = conn.execute(
        select(EVENTS.c.reason, EVENTS.c.detail).where(
            EVENTS.c.at >= start, EVENTS.c.transition.in_(_FAILURES)
        )
    )
    counts = Counter(error_code(reason, detail) for reason, detail in rows)
    return counts.most_common()


def error_code(reason: str | None, detail: Mapping[str, Any] | None) -> str:
    if isinstance(detail, Mapping) and detail.get("type"):
        return str(detail["type"]).rsplit(".", 1)[-1]
    found = _CODE.match(reason or "")
    return found[1] if found else "other"


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
