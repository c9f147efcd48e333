"""The admin summary: every registered run table, read in its own home.

Seed 000: the monitor reads each domain's run table where it lives and brings them
together as ``(module, job_id, state, attempts, age, error)``; there is no central table,
and the ``job_runs_all`` view (migration 0003) is a convenience for ad-hoc SQL that this
module does not depend on. Every statement is bounded and follows an existing index:

- newest rows: one statement per run table, a ``LIMIT`` branch per state on
  ``ix_<table>_state_updated`` (``ORDER BY updated_at`` across all states would sort the
  whole journal);
- counts: queued and running runs on the same index, the oldest ``ACTIVE_CAP`` of each
  state (a larger backlog reads "10,000+", its series counted in those rows), finished
  runs from ``run_counts``, which beat's rollup keeps (journal/finished_counts.py): a
  finished run is counted once a rollup pass has seen it, and until retention deletes it;
- stale runs: the partial index of running heartbeats;
- outbox backlog and lag: the partial index of unpublished rows.

``age_seconds`` is the time a job has spent in its current state (``now - updated_at``):
that is what an operator asks of a queued, running or failed job. ``created_at`` is
reported too, but a job retried or replayed over days would look old by it while its
current attempt is fresh.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Select, and_, func, or_, select, union_all
from sqlalchemy.sql import ColumnElement, Subquery

import jobsapp.schema  # noqa: F401 - imports every domain, so each run table is registered
from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import finished_counts, registry
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules.states import ACTIVE_STATES, ALL_STATES, Outcome, State

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
# Active runs read per run table and state by the live counts (overview, /metrics/cluster,
# queues page), the oldest first: a page reloaded every 5 s and a scrape read what they
# show ("10,000+"), not every row of a backlog of any size.
ACTIVE_CAP = 10_000
# Enough of last_error for its first line; the rest (step statistics) stays in the row.
_ERROR_PREFIX = 1000
_ERROR_LINE = 300


class BadFilter(ValueError):
    """A summary filter names no state or no registered module, or a limit out of range."""


@dataclass(frozen=True)
class SummaryRow:
    module: str
    job_id: uuid.UUID
    task_name: str
    state: str
    outcome: str | None
    attempts: int
    max_attempts: int
    age_seconds: float
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    worker: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "job_id": str(self.job_id),
            "task_name": self.task_name,
            "state": self.state,
            "outcome": self.outcome,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "age_seconds": round(self.age_seconds, 3),
            "last_error": self.last_error,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "worker": self.worker,
        }


# A run table's rows of one task on one broker queue (None: the task's default route).
Series = tuple[str, str, str | None]


@dataclass(frozen=True)
class Health:
    """The numbers the metrics endpoint exports, read in one connection."""

    counts: dict[str, dict[str, int]]
    oldest_queued_age: dict[str, float | None]
    stale_running: dict[str, int]
    outbox_backlog: int
    outbox_lag: float
    # The same rows by task and queue: ``(series, state) -> rows``, and the seconds the
    # oldest due queued job of each series has waited.
    series_counts: dict[tuple[Series, str], int]
    series_oldest: dict[Series, float]
    # ``(module, state)`` of the active states with more than ``ACTIVE_CAP`` rows: their
    # counts are those of the oldest ``ACTIVE_CAP`` (at least that many), as is the oldest
    # wait of a series with no row among them (none shown).
    capped: frozenset[tuple[str, str]] = frozenset()


# ------------------------------------------------------------------------- filters


# What an operator filters by: the journal's states, with a cancel or an expiry (a failed
# run whose outcome says nobody's code failed) apart from the failures.
NOT_FAILURES = (Outcome.CANCELLED.value, Outcome.EXPIRED.value)
FILTERS: tuple[str, ...] = (*ALL_STATES, *NOT_FAILURES)


def checked_states(states: Iterable[str] | None) -> tuple[str, ...]:
    if states is None:
        return FILTERS
    wanted = tuple(dict.fromkeys(states))
    unknown = [s for s in wanted if s not in FILTERS]
    if unknown or not wanted:
        raise BadFilter(f"state must be one of {', '.join(FILTERS)}; got {unknown or 'none'}")
    return wanted


def in_state(table: Any, name: str) -> ColumnElement[bool]:
    """The rows a filter name selects (on the state index): ``failed`` leaves out the
    cancelled and expired runs, which ``cancelled`` and ``expired`` select."""
    failed = table.c.state == State.FAILED.value
    if name in NOT_FAILURES:
        return and_(failed, table.c.outcome == name)
    if name == State.FAILED.value:
        return and_(failed, or_(table.c.outcome.is_(None), table.c.outcome.not_in(NOT_FAILURES)))
    return table.c.state == name  # type: ignore[no-any-return]


def state_conditions(table: Any, names: Iterable[str]) -> list[ColumnElement[bool]]:
    """One condition per indexed branch for the filter names: failures, cancels and expiries
    asked for together are the one state ``failed`` (one branch, not three)."""
    wanted = list(names)
    if {State.FAILED.value, *NOT_FAILURES} <= set(wanted):
        whole = table.c.state == State.FAILED.value
        return [
            whole if n == State.FAILED.value else in_state(table, n)
            for n in wanted
            if n not in NOT_FAILURES
        ]
    return [in_state(table, n) for n in wanted]


def checked_tables(module: str | None) -> list[RunTable]:
    if module is None:
        return list(registry.all_tables())
    try:
        return [registry.get(module)]
    except KeyError:
        known = ", ".join(spec.module for spec in registry.all_tables())
        raise BadFilter(f"no run table is registered for module {module!r} ({known})") from None


def checked_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise BadFilter(f"limit must be between 1 and {MAX_LIMIT}")
    return limit


# ------------------------------------------------------------------------- summary


def summarize(
    engine: Engine,
    *,
    states: Iterable[str] | None = None,
    module: str | None = None,
    limit: int = DEFAULT_LIMIT,
    now: datetime | None = None,
) -> list[SummaryRow]:
    """The newest ``limit`` runs (by ``updated_at``) over every registered run table."""
    wanted, specs, limit = checked_states(states), checked_tables(module), checked_limit(limit)
    now = now or utcnow()
    rows: list[SummaryRow] = []
    with engine.connect() as conn:
        for spec in specs:
            found = conn.execute(_newest(spec, wanted, limit)).mappings()
            rows.extend(summary_row(spec, dict(r), now) for r in found)
    rows.sort(key=lambda r: (r.updated_at, r.job_id.hex), reverse=True)
    return rows[:limit]


def _newest(spec: RunTable, states: Sequence[str], limit: int) -> Select[Any]:
    table = spec.table
    columns = [
        table.c[name]
        for name in (
            "job_id",
            "task_name",
            "state",
            "outcome",
            "attempts",
            "max_attempts",
            "created_at",
            "updated_at",
            "worker",
        )
    ]
    error = func.substr(table.c.last_error, 1, _ERROR_PREFIX).label("last_error")
    # One indexed LIMIT branch per state; SQLite wants each wrapped as a subquery.
    branches = [
        select(*columns, error)
        .where(condition)
        .order_by(table.c.updated_at.desc())
        .limit(limit)
        .subquery()
        for condition in state_conditions(table, states)
    ]
    merged = union_all(*(select(b) for b in branches)).subquery()
    return select(merged).order_by(merged.c.updated_at.desc()).limit(limit)


def summary_row(spec: RunTable, row: dict[str, Any], now: datetime) -> SummaryRow:
    return SummaryRow(
        module=spec.module,
        job_id=row["job_id"],
        task_name=row["task_name"],
        state=row["state"],
        outcome=row["outcome"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        age_seconds=_seconds(now - row["updated_at"]),
        last_error=first_line(row["last_error"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        worker=row["worker"],
    )


def first_line(error: str | None) -> str | None:
    """The headline of a stored error (its first non-empty line), shortened for a table."""
    if not error:
        return None
    line = next((part.strip() for part in error.splitlines() if part.strip()), "")
    return line if len(line) <= _ERROR_LINE else line[: _ERROR_LINE - 1] + "\u2026"


def human_age(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``, ``4d03h``: an age an operator reads at a glance."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _seconds(delta: timedelta) -> float:
    # A clock a little behind another writer's must not show a negative age.
    return max(0.0, delta.total_seconds())


# ----------------------------------------------------------------- health numbers


def counts(engine: Engine) -> dict[str, dict[str, int]]:
    """``module -> state -> rows``; every state is present, zero included."""
    with engine.connect() as conn:
        return _counts(conn)


def oldest_queued_age(engine: Engine, *, now: datetime | None = None) -> dict[str, float | None]:
    """``module -> seconds`` the oldest due queued job has waited (None: nothing queued).

    A job whose ``next_retry_at`` is still ahead is not waiting for a worker, so it does
    not count; the age is taken from ``updated_at``, when the job entered ``queued``.
    """
    with engine.connect() as conn:
        return _oldest_queued(conn, now or utcnow())


def stale_running(
    engine: Engine, stale_after: timedelta | float, *, now: datetime | None = None
) -> dict[str, int]:
    """``module -> running jobs`` whose heartbeat is older than ``stale_after``."""
    with engine.connect() as conn:
        return _stale(conn, _delta(stale_after), now or utcnow())


def outbox_backlog(engine: Engine, *, now: datetime | None = None) -> int:
    """Outbox rows that are due and not yet published."""
    with engine.connect() as conn:
        return _backlog(conn, now or utcnow())


def outbox_lag(engine: Engine, *, now: datetime | None = None) -> float:
    """Seconds the oldest due, unpublished outbox row has been due (0 when none)."""
    with engine.connect() as conn:
        return _lag(conn, now or utcnow())


def health(engine: Engine, stale_after: timedelta | float) -> Health:
    now = utcnow()
    with engine.connect() as conn:
        active = _active(conn, now)
        by_series = _with_finished(conn, active.counts)
        return Health(
            counts=_per_module(by_series),
            oldest_queued_age=_oldest_per_module(active.oldest),
            stale_running=_stale(conn, _delta(stale_after), now),
            outbox_backlog=_backlog(conn, now),
            outbox_lag=_lag(conn, now),
            series_counts=by_series,
            series_oldest=active.oldest,
            capped=active.capped,
        )


def _delta(value: timedelta | float) -> timedelta:
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


def _counts(conn: Connection) -> dict[str, dict[str, int]]:
    return _per_module(_with_finished(conn, _active(conn, utcnow()).counts))


def oldest_active(table: Any, state: str, *columns: str, since: datetime | None = None) -> Subquery:
    """The oldest ``ACTIVE_CAP`` rows in an active ``state`` (updated ``since``, if given),
    with ``updated_at`` and ``next_retry_at``, in order on ``ix_<table>_state_updated``."""
    wanted = dict.fromkeys((*columns, "updated_at", "next_retry_at"))
    recent = [] if since is None else [table.c.updated_at >= since]
    return (
        select(*(table.c[name] for name in wanted))
        .where(table.c.state == state, *recent)
        .order_by(table.c.updated_at)
        .limit(ACTIVE_CAP)
        .subquery()
    )


@dataclass(frozen=True)
class _Active:
    counts: dict[tuple[Series, str], int]
    oldest: dict[Series, float]
    capped: frozenset[tuple[str, str]]


def _active(conn: Connection, now: datetime) -> _Active:
    """Queued and running runs by series, up to ``ACTIVE_CAP`` of each state per run table,
    and the seconds the oldest due queued run of each series has waited: read oldest
    first, a series' first row among them is its oldest."""
    counts: dict[tuple[Series, str], int] = {}
    oldest: dict[Series, float] = {}
    capped: set[tuple[str, str]] = set()
    for spec in registry.all_tables():
        for state in ACTIVE_STATES:
            rows = oldest_active(spec.table, state, "task_name", "queue")
            stmt = select(
                rows.c.task_name,
                rows.c.queue,
                func.count(),
                func.min(rows.c.updated_at).filter(_due(rows, now)),
            ).group_by(rows.c.task_name, rows.c.queue)
            read = 0
            for task, queue, n, since in conn.execute(stmt).all():
                counts[((spec.module, task, queue), state)] = int(n)
                read += int(n)
                if state == State.QUEUED.value and since is not None:
                    oldest[(spec.module, task, queue)] = _seconds(now - since)
            if read >= ACTIVE_CAP:
                capped.add((spec.module, state))
    return _Active(counts, oldest, frozenset(capped))


def _with_finished(
    conn: Connection, active: dict[tuple[Series, str], int]
) -> dict[tuple[Series, str], int]:
    """The active counts and the finished runs as the rollup counted them."""
    found = dict(active)
    for (module, task, queue, state, _), n in finished_counts.read(conn).items():
        series = ((module, task, queue or None), state)
        found[series] = found.get(series, 0) + n
    return found


def _per_module(by_series: dict[tuple[Series, str], int]) -> dict[str, dict[str, int]]:
    found = {spec.module: dict.fromkeys(ALL_STATES, 0) for spec in registry.all_tables()}
    for ((module, _, _), state), n in by_series.items():
        found[module][state] = found[module].get(state, 0) + n
    return found


def _oldest_per_module(oldest: dict[Series, float]) -> dict[str, float | None]:
    found: dict[str, float | None] = {spec.module: None for spec in registry.all_tables()}
    for (module, _, _), age in oldest.items():
        found[module] = max(age, found.get(module) or 0.0)
    return found


def _due(table: Any, now: datetime) -> Any:
    # A job whose next_retry_at is still ahead is not waiting for a worker.
    return or_(table.c.next_retry_at.is_(None), table.c.next_retry_at <= now)


def _oldest_queued(conn: Connection, now: datetime) -> dict[str, float | None]:
    ages: dict[str, float | None] = {}
    for spec in registry.all_tables():
        table = spec.table
        stmt = (
            select(table.c.updated_at)
            .where(table.c.state == State.QUEUED.value, _due(table, now))
            .order_by(table.c.updated_at)
            .limit(1)
        )
        since = conn.execute(stmt).scalar()
        ages[spec.module] = None if since is None else _seconds(now - since)
    return ages


def _stale(conn: Connection, stale_after: timedelta, now: datetime) -> dict[str, int]:
    found: dict[str, int] = {}
    for spec in registry.all_tables():
        table = spec.table
        stmt = select(func.count()).where(
            table.c.state == State.RUNNING.value, table.c.heartbeat_at < now - stale_after
        )
        found[spec.module] = int(conn.execute(stmt).scalar_one())
    return found


def _due_unpublished(now: datetime) -> tuple[Any, ...]:
    out = journal.OUTBOX
    # A dead row is not backlog: the relay stopped trying it (jobsapp_outbox_dead).
    return (out.c.published_at.is_(None), out.c.dead_at.is_(None), out.c.available_at <= now)


def _backlog(conn: Connection, now: datetime) -> int:
    stmt = select(func.count()).select_from(journal.OUTBOX).where(*_due_unpublished(now))
    return int(conn.execute(stmt).scalar_one())


def _lag(conn: Connection, now: datetime) -> float:
    out = journal.OUTBOX
    stmt = (
        select(out.c.available_at)
        .where(*_due_unpublished(now))
        .order_by(out.c.available_at)
        .limit(1)
    )
    due_since = conn.execute(stmt).scalar()
    return 0.0 if due_since is None else _seconds(now - due_since)


# ------------------------------------------------------------ counts by outcome


@dataclass(frozen=True)
class OutcomeCount:
    module: str
    state: str
    outcome: str | None
    jobs: int


def outcome_counts(engine: Engine, *, module: str | None = None) -> list[OutcomeCount]:
    """Jobs per ``(module, state, outcome)``: active ones counted live on the state index,
    finished ones as the rollup counted them; in state order then by count."""
    specs = checked_tables(module)
    found: Counter[tuple[str, str, str | None]] = Counter()
    with engine.connect() as conn:
        for spec in specs:
            table = spec.table
            stmt = (
                select(table.c.state, table.c.outcome, func.count())
                .where(table.c.state.in_(ACTIVE_STATES))
                .group_by(table.c.state, table.c.outcome)
            )
            for state, outcome, n in conn.execute(stmt).all():
                found[(spec.module, str(state), outcome)] += int(n)
        for (mod, _, _, state, outcome), n in finished_counts.read(conn, module).items():
            found[(mod, state, outcome or None)] += n
    counts = [OutcomeCount(m, s, o, n) for (m, s, o), n in found.items() if n]
    order = {state: i for i, state in enumerate(ALL_STATES)}
    return sorted(counts, key=lambda c: (c.module, order.get(c.state, len(order)), -c.jobs))
