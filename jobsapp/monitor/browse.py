"""What the admin UI reads: a filtered, paged job list, one job with its history, and the
job of an attachment.

Paging is a keyset on ``(updated_at, job_id)``, newest first, merged across the run
tables: a page does not shift when new jobs arrive, and a deep page costs what the first
does (``ix_<table>_state_updated``). The text search is the exception: it matches
``job_id`` and ``last_error`` by substring, which no index serves, so it scans the run
tables (bounded by journal retention) and is meant for narrowing a list, not for a
dashboard that polls.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, String, and_, cast, func, or_, select
from sqlalchemy.sql import ColumnElement

from jobsapp.db import utcnow
from jobsapp.lifecycle import outbox_queries
from jobsapp.lifecycle.registry import RunTable
from jobsapp.lifecycle.states import ALL_STATES, Transition
from jobsapp.lifecycle.tables import JobEvent
from jobsapp.monitor.summary import BadFilter, SummaryRow, checked_tables, summary_row

EVENTS = JobEvent.__table__
PAGE_SIZE = 50
# Counting stops here: an exact count of a large journal costs a scan per page view.
COUNT_CAP = 10_000
MAX_TEXT = 200
# ASCII digits, and few: a longer number is no age a journal holds, and would overflow.
_AGE = re.compile(r"([0-9]{1,6})([smhd]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_CURSOR_SEPARATOR = "~"
# The transitions that end an attempt, and how the timeline names each ending.
ENDINGS = {
    Transition.SUCCEED.value: "succeeded",
    Transition.FAIL.value: "failed",
    Transition.RETRY.value: "failed, retry planned",
    Transition.SNOOZE.value: "paused (Retry-After)",
    Transition.REAP_REQUEUE.value: "stale, requeued by the reaper",
    Transition.REAP_FAIL.value: "stale, failed by the reaper",
}


@dataclass(frozen=True)
class JobFilter:
    """What the jobs list shows; every field narrows it, None and empty mean all."""

    module: str | None = None
    states: tuple[str, ...] = ALL_STATES
    task: str | None = None
    # Seconds in the current state (``now - updated_at``), at least / at most.
    min_age: float | None = None
    max_age: float | None = None
    text: str | None = None
    attachment_id: uuid.UUID | None = None


@dataclass(frozen=True)
class Cursor:
    """The last row of a page: the next page starts strictly after it."""

    updated_at: datetime
    job_id: uuid.UUID

    def encode(self) -> str:
        return f"{self.updated_at.isoformat()}{_CURSOR_SEPARATOR}{self.job_id}"


@dataclass(frozen=True)
class JobPage:
    rows: list[SummaryRow]
    # Matching jobs in all, counted up to COUNT_CAP per run table (then ``exact`` is False).
    total: int
    next: Cursor | None
    exact: bool = True


@dataclass(frozen=True)
class EventRow:
    attempt: int
    transition: str
    from_state: str | None
    to_state: str | None
    actor: str
    reason: str | None
    at: datetime
    # The stored traceback, where the event row carries one.
    detail: str | None = None


@dataclass(frozen=True)
class AttemptRow:
    number: int
    worker: str | None
    started_at: datetime | None
    ended_at: datetime | None
    outcome: str
    error: str | None
    detail: str | None


@dataclass(frozen=True)
class JobDetail:
    module: str
    run: Mapping[str, Any]
    events: list[EventRow]
    attempts: list[AttemptRow]

    @property
    def attachment_id(self) -> uuid.UUID | None:
        value = self.run.get("attachment_id")
        return value if isinstance(value, uuid.UUID) else None


# ----------------------------------------------------------------- input (pure)


def parse_age(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``3d`` -> seconds."""
    found = _AGE.fullmatch(text.strip().lower())
    if found is None:
        raise BadFilter(f"an age is a number with s, m, h or d (15m, 2h, 3d); got {text!r}")
    return float(int(found[1]) * _UNIT_SECONDS[found[2]])


def parse_cursor(text: str) -> Cursor:
    stamp, _, job = text.partition(_CURSOR_SEPARATOR)
    try:
        cursor = Cursor(datetime.fromisoformat(stamp), uuid.UUID(job))
    except ValueError:
        raise BadFilter("the page cursor is malformed; start again from the first page") from None
    if cursor.updated_at.tzinfo is None:
        raise BadFilter("the page cursor has no time zone; start again from the first page")
    return cursor


def checked_text(text: str | None) -> str | None:
    text = (text or "").strip()
    if len(text) > MAX_TEXT:
        raise BadFilter(f"the search text is limited to {MAX_TEXT} characters")
    return text or None


# ------------------------------------------------------------------------- the list


def find_jobs(
    engine: Engine, wanted: JobFilter, *, after: Cursor | None = None,
    limit: int = PAGE_SIZE, now: datetime | None = None,
) -> JobPage:  # fmt: skip
    """One page of matching jobs, newest first, and how many match in all."""
    now = now or utcnow()
    rows: list[SummaryRow] = []
    counts: list[int] = []
    with engine.connect() as conn:
        for spec in _tables(wanted):
            where = _matching(spec, wanted, now)
            counts.append(_count(conn, spec, where))
            rows += _newest(conn, spec, where, wanted.states, after, limit + 1, now)
    rows.sort(key=lambda r: (r.updated_at, r.job_id), reverse=True)
    more = len(rows) > limit
    rows = rows[:limit]
    after_last = Cursor(rows[-1].updated_at, rows[-1].job_id) if more else None
    exact = all(n <= COUNT_CAP for n in counts)
    return JobPage(rows, sum(min(n, COUNT_CAP) for n in counts), after_last, exact)


def _newest(
    conn: Connection, spec: RunTable, where: Sequence[Any], states: Sequence[str],
    after: Cursor | None, limit: int, now: datetime,
) -> list[SummaryRow]:  # fmt: skip
    # One indexed branch per state (ix_<table>_state_updated): an IN list over the
    # states would sort every matching row of the table for each page.
    found: list[SummaryRow] = []
    for state in states:
        page = _page(spec, [*where, spec.table.c.state == state], after, limit)
        found.extend(summary_row(spec, dict(r), now) for r in conn.execute(page).mappings())
    return found


def _count(conn: Connection, spec: RunTable, where: Sequence[Any]) -> int:
    """Matching rows, up to COUNT_CAP + 1 (more than the cap: not exact)."""
    capped = select(spec.table.c.job_id).where(*where).limit(COUNT_CAP + 1).subquery()
    return int(conn.execute(select(func.count()).select_from(capped)).scalar_one())


def _tables(wanted: JobFilter) -> list[RunTable]:
    specs = checked_tables(wanted.module)
    if wanted.attachment_id is None:
        return specs
    return [spec for spec in specs if "attachment_id" in spec.table.c]


def _matching(spec: RunTable, wanted: JobFilter, now: datetime) -> list[ColumnElement[bool]]:
    table = spec.table
    where: list[ColumnElement[bool]] = [table.c.state.in_(wanted.states)]
    if wanted.task:
        where.append(table.c.task_name == wanted.task)
    if wanted.min_age is not None:
        where.append(table.c.updated_at <= now - timedelta(seconds=wanted.min_age))
    if wanted.max_age is not None:
        where.append(table.c.updated_at >= now - timedelta(seconds=wanted.max_age))
    if wanted.text:
        where.append(_text_match(spec, wanted.text))
    if wanted.attachment_id is not None:
        where.append(table.c.attachment_id == wanted.attachment_id)
    return where


def _text_match(spec: RunTable, text: str) -> ColumnElement[bool]:
    table = spec.table
    # Postgres spells a uuid with dashes, SQLite stores 32 hex digits: try both.
    job_id = cast(table.c.job_id, String)
    return or_(
        job_id.icontains(text, autoescape=True),
        job_id.icontains(text.replace("-", ""), autoescape=True),
        table.c.last_error.icontains(text, autoescape=True),
    )


def _page(spec: RunTable, where: Sequence[Any], after: Cursor | None, limit: int) -> Any:
    table = spec.table
    if after is not None:
        where = [*where, or_(table.c.updated_at < after.updated_at,
                             and_(table.c.updated_at == after.updated_at,
                                  table.c.job_id < after.job_id))]  # fmt: skip
    stmt = select(*[table.c[name] for name in _LISTED], table.c.last_error)
    order = (table.c.updated_at.desc(), table.c.job_id.desc())
    return stmt.where(*where).order_by(*order).limit(limit)


_LISTED = ("job_id", "task_name", "state", "outcome", "attempts", "max_attempts",
           "created_at", "updated_at", "worker")  # fmt: skip


# ---------------------------------------------------------------------- one job


def job_detail(engine: Engine, module: str, job_id: uuid.UUID) -> JobDetail | None:
    """The run row and its whole ``job_events`` history; None when there is no such job."""
    (spec,) = checked_tables(module)
    table = spec.table
    with engine.connect() as conn:
        run = conn.execute(select(table).where(table.c.job_id == job_id)).mappings().first()
        if run is None:
            return None
        events = _events(conn, spec.module, job_id)
    return JobDetail(spec.module, dict(run), events, attempts_of(events))


def _events(conn: Connection, module: str, job_id: uuid.UUID) -> list[EventRow]:
    stmt = (
        select(EVENTS)
        .where(EVENTS.c.module == module, EVENTS.c.job_id == job_id)
        .order_by(EVENTS.c.id)
    )
    return [_event_row(dict(row)) for row in conn.execute(stmt).mappings()]


def _event_row(row: Mapping[str, Any]) -> EventRow:
    return EventRow(
        attempt=row["attempt"], transition=row["transition"], from_state=row["from_state"],
        to_state=row["to_state"], actor=row["actor"], reason=row["reason"], at=row["at"],
        detail=detail_text(row.get("detail")),
    )  # fmt: skip


def detail_text(detail: object) -> str | None:
    """A failed attempt's stored detail as a person reads it: the exception type and
    message on one line, then the traceback with its own line breaks."""
    if not detail:
        return None
    if not isinstance(detail, Mapping):
        return str(detail)
    head = ": ".join(str(detail[k]) for k in ("type", "message") if detail.get(k))
    return "\n\n".join(part for part in (head, str(detail.get("traceback") or "")) if part)


def attempts_of(events: Iterable[EventRow]) -> list[AttemptRow]:
    """One row per attempt a worker claimed: who ran it, when, and how it ended."""
    claims: dict[int, EventRow] = {}
    ends: dict[int, EventRow] = {}
    for event in events:
        if event.transition == Transition.CLAIM.value:
            claims.setdefault(event.attempt, event)
        elif event.transition in ENDINGS:
            ends[event.attempt] = event
    return [_attempt(n, claims[n], ends.get(n)) for n in sorted(claims)]


def _attempt(number: int, claim: EventRow, end: EventRow | None) -> AttemptRow:
    if end is None:
        return AttemptRow(number, claim.actor, claim.at, None, "running", None, None)
    outcome = ENDINGS[end.transition]
    return AttemptRow(number, claim.actor, claim.at, end.at, outcome, end.reason, end.detail)


# ------------------------------------------------------------------ attachments


def attachment_job(engine: Engine, attachment_id: uuid.UUID) -> dict[str, Any] | None:
    """The attachment's current job (its newest run): module, job_id, attempt, state."""
    with engine.connect() as conn:
        newest = [found for spec in _tables(JobFilter(attachment_id=attachment_id))
                  if (found := _newest_run(conn, spec, attachment_id)) is not None]  # fmt: skip
    if not newest:
        return None
    module, run = max(newest, key=lambda found: found[1]["created_at"])
    return {"module": module, "job_id": str(run["job_id"]), "attempt": run["attempts"],
            "state": run["state"]}  # fmt: skip


def _newest_run(
    conn: Connection, spec: RunTable, attachment_id: uuid.UUID
) -> tuple[str, Mapping[str, Any]] | None:
    table = spec.table
    stmt = (
        select(table.c.job_id, table.c.attempts, table.c.state, table.c.created_at)
        .where(table.c.attachment_id == attachment_id)
        .order_by(table.c.created_at.desc())
        .limit(1)
    )
    run = conn.execute(stmt).mappings().first()
    return None if run is None else (spec.module, dict(run))


# ------------------------------------------------------------------------- outbox


def dead_outbox(engine: Engine, *, limit: int) -> tuple[int, list[outbox_queries.DeadRow]]:
    """How many outbox rows the relay gave up on, and the newest ``limit`` of them."""
    with engine.connect() as conn:
        return outbox_queries.count_dead(conn), outbox_queries.dead_rows(conn, limit=limit)
