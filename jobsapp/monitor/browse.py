"""What the admin UI reads: a filtered, paged job list, one job with its history, and the
job of an attachment.

Paging is a keyset on ``(updated_at, job_id)``, newest first, merged across the run
tables: a page does not shift when new jobs arrive, and a deep page costs what the first
does (``ix_<table>_state_updated``). The text search reads a bounded number of rows: an
id prefix as a range of the primary key, and a substring of the id, the error or the
arguments (which no index serves) in the newest ``SEARCH_ROWS`` rows of each run table,
shared between the states searched.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Select, String, and_, cast, func, or_, select, tuple_
from sqlalchemy.exc import OperationalError
from sqlalchemy.sql import ColumnElement

from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import OUTBOX, Run, outbox_queries, registry
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules.states import State, Transition
from jobsapp.monitor import workers
from jobsapp.monitor.summary import (
    FILTERS,
    BadFilter,
    SummaryRow,
    checked_tables,
    state_conditions,
    summary_row,
)

PAGE_SIZE = 50
# Counting stops here: an exact count of a large journal costs a scan per page view.
COUNT_CAP = 10_000
# How much of a job's arguments a list row loads (the page shows less, once scrubbed).
ARGS_PREVIEW = 1024
MAX_TEXT = 200
# A text search reads at most this many of the newest rows of each run table, shared
# between the states it searches: a substring of an error or of arguments is matched by
# reading rows, and a search that matches nothing must not read the journal.
SEARCH_ROWS = 20_000
# How long a text search may read (PostgreSQL's statement_timeout, below the console's
# own): a search that would take longer is refused with a hint, not left to run.
SEARCH_TIMEOUT = timedelta(seconds=2)
_QUERY_CANCELED = "57014"  # PostgreSQL's SQLSTATE for a statement_timeout
# Hex digits from which a search is also an id prefix (the first group of a uuid).
ID_PREFIX_MIN = 8
_HEX = re.compile(r"[0-9a-f]+")
# ASCII digits, and few: a longer number is no age a journal holds, and would overflow.
_AGE = re.compile(r"([0-9]{1,6})([smhd]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
# Longer than any journal keeps a run; past it, "now minus the age" leaves the calendar.
MAX_AGE_DAYS = 3650
_CURSOR_SEPARATOR = "~"
# Celery's own default (``task_default_queue``): the UI passes the app's.
DEFAULT_QUEUE = "celery"
# The transitions that end an attempt, and how the timeline names each ending.
ENDINGS = {
    Transition.SUCCEED.value: "succeeded",
    Transition.FAIL.value: "failed",
    Transition.RETRY.value: "failed, retry planned",
    Transition.SNOOZE.value: "paused (Retry-After)",
    Transition.REAP_REQUEUE.value: "stale, requeued by the reaper",
    Transition.REAP_FAIL.value: "stale, failed by the reaper",
    Transition.CANCEL.value: "cancelled by a revoke",
}


@dataclass(frozen=True)
class JobFilter:
    """What the jobs list shows; every field narrows it, None and empty mean all."""

    module: str | None = None
    states: tuple[str, ...] = FILTERS
    task: str | None = None
    # Seconds in the current state (``now - updated_at``), at least / at most.
    min_age: float | None = None
    max_age: float | None = None
    text: str | None = None
    attachment_id: uuid.UUID | None = None
    # A broker queue; the app's default queue also matches runs that name none (NULL).
    queue: str | None = None
    default_queue: str = DEFAULT_QUEUE


@dataclass(frozen=True)
class Cursor:
    """The last row of a page: the next page starts strictly after it."""

    updated_at: datetime
    job_id: uuid.UUID

    def encode(self) -> str:
        return f"{self.updated_at.isoformat()}{_CURSOR_SEPARATOR}{self.job_id}"


@dataclass(frozen=True)
class RowExtra:
    """What the console's list shows beside a summary row."""

    queue: str
    # The head of the job's arguments as JSON text (a generic job's params, at most
    # ARGS_PREVIEW characters; a domain's id columns), unscrubbed.
    args: str | None
    # Why a queued job is not running yet, when the journal or the registry can tell.
    waiting: str | None = None
    # A queued run's not-before time (a retry's backoff, a countdown).
    due: datetime | None = None


@dataclass(frozen=True)
class JobPage:
    rows: list[SummaryRow]
    # Matching jobs in all, counted up to COUNT_CAP per run table (then ``exact`` is False).
    total: int
    next: Cursor | None
    exact: bool = True
    extras: Mapping[tuple[str, uuid.UUID], RowExtra] = field(default_factory=dict)

    def extra(self, row: SummaryRow) -> RowExtra | None:
        return self.extras.get((row.module, row.job_id))


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
    run: Run
    events: list[EventRow]
    attempts: list[AttemptRow]

    @property
    def attachment_id(self) -> uuid.UUID | None:
        value = self.run.columns.get("attachment_id")
        return value if isinstance(value, uuid.UUID) else None


# ----------------------------------------------------------------- input (pure)


def parse_age(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``3d`` -> seconds."""
    found = _AGE.fullmatch(text.strip().lower())
    if found is None:
        raise BadFilter(f"an age is a number with s, m, h or d (15m, 2h, 3d); got {text!r}")
    seconds = int(found[1]) * _UNIT_SECONDS[found[2]]
    if seconds > MAX_AGE_DAYS * 86400:
        raise BadFilter(f"an age is at most {MAX_AGE_DAYS}d; got {text!r}")
    return float(seconds)


def parse_cursor(text: str) -> Cursor:
    stamp, _, job = text.partition(_CURSOR_SEPARATOR)
    try:
        cursor = Cursor(datetime.fromisoformat(stamp), uuid.UUID(job))
    except ValueError:
        raise BadFilter("the page cursor is malformed; start again from the first page") from None
    if cursor.updated_at.tzinfo is None:
        raise BadFilter("the page cursor has no time zone; start again from the first page")
    try:
        cursor.updated_at.astimezone(UTC)
    except OverflowError:  # year 1 at +14:00 is before the calendar starts, in UTC
        raise BadFilter(
            "the page cursor is out of range; start again from the first page"
        ) from None
    return cursor


def checked_text(text: str | None) -> str | None:
    text = (text or "").strip()
    if len(text) > MAX_TEXT:
        raise BadFilter(f"the search text is limited to {MAX_TEXT} characters")
    return text or None


# ------------------------------------------------------------------------- the list


def find_jobs(
    engine: Engine,
    wanted: JobFilter,
    *,
    after: Cursor | None = None,
    limit: int = PAGE_SIZE,
    now: datetime | None = None,
) -> JobPage:
    """One page of matching jobs, newest first, and how many match in all."""
    now = now or utcnow()
    found: list[Listed] = []
    counts: list[int] = []
    with engine.connect() as conn, _search_bound(conn, wanted):
        for spec in _tables(wanted):
            where = _matching(spec, wanted, now)
            if wanted.text:
                count, searched = _searched(conn, spec, where, wanted, after, limit + 1, now)
                counts.append(count)
                found += searched
                continue
            counts.append(_listed_count(conn, spec, where, wanted.states))
            found += _newest(conn, spec, where, wanted.states, after, limit + 1, now)
        found.sort(key=lambda r: (r[0].updated_at, r[0].job_id), reverse=True)
        more = len(found) > limit
        found = found[:limit]
        extras = _extras(conn, found, wanted.default_queue, now)
    rows = [row for row, _ in found]
    after_last = Cursor(rows[-1].updated_at, rows[-1].job_id) if more else None
    exact = all(n <= COUNT_CAP for n in counts)
    return JobPage(rows, sum(min(n, COUNT_CAP) for n in counts), after_last, exact, extras)


class SearchTooSlow(Exception):
    """A text search read longer than ``SEARCH_TIMEOUT`` and was stopped."""


@contextmanager
def _search_bound(conn: Connection, wanted: JobFilter) -> Iterator[None]:
    """A text search's transaction runs at most ``SEARCH_TIMEOUT`` (PostgreSQL)."""
    if not wanted.text or conn.dialect.name != "postgresql":
        yield
        return
    bound = round(SEARCH_TIMEOUT.total_seconds() * 1000)
    conn.exec_driver_sql(f"SET LOCAL statement_timeout TO {bound}")
    try:
        yield
    except OperationalError as exc:
        if getattr(exc.orig, "pgcode", None) != _QUERY_CANCELED:
            raise
        raise SearchTooSlow(
            f"the search for {wanted.text!r} read for more than "
            f"{SEARCH_TIMEOUT.total_seconds():g} s and was stopped: narrow it with a state, a "
            "task, a queue or an age, or search by job id"
        ) from None


# A summary row and the run row's columns it came from.
Listed = tuple[SummaryRow, Mapping[str, Any]]


def _newest(
    conn: Connection,
    spec: RunTable,
    where: Sequence[Any],
    states: Sequence[str],
    after: Cursor | None,
    limit: int,
    now: datetime,
) -> list[Listed]:
    # One indexed branch per state (ix_<table>_state_updated): an IN list over the
    # states would sort every matching row of the table for each page.
    found: list[Listed] = []
    for condition in state_conditions(spec.table, states):
        page = _page(spec, [*where, condition], after, limit)
        found.extend(
            (summary_row(spec, dict(r), now), dict(r)) for r in conn.execute(page).mappings()
        )
    return found


def jobs_by_key(
    engine: Engine, keys: Iterable[tuple[str, uuid.UUID]], default_queue: str = DEFAULT_QUEUE
) -> JobPage:
    """The named jobs (``(module, job_id)``; unknown ones left out), newest first."""
    wanted: dict[str, list[uuid.UUID]] = {}
    for module, job_id in keys:
        wanted.setdefault(module, []).append(job_id)
    now = utcnow()
    found: list[Listed] = []
    with engine.connect() as conn:
        for spec in checked_tables(None):
            if spec.module in wanted:
                stmt = _page(
                    spec,
                    [spec.table.c.job_id.in_(wanted[spec.module])],
                    None,
                    len(wanted[spec.module]),
                )
                found += [
                    (summary_row(spec, dict(r), now), dict(r))
                    for r in conn.execute(stmt).mappings()
                ]
        found.sort(key=lambda r: (r[0].updated_at, r[0].job_id), reverse=True)
        extras = _extras(conn, found, default_queue, now)
    return JobPage([row for row, _ in found], len(found), None, True, extras)


def _extras(
    conn: Connection, found: Sequence[Listed], default_queue: str, now: datetime
) -> dict[tuple[str, uuid.UUID], RowExtra]:
    """Queue, arguments and, for a queued job, why it waits: a dead outbox row, a retry
    or countdown not due yet, or a queue no live worker consumes."""
    queued = [
        (row.module, row.job_id, row.attempts + 1)
        for row, _ in found
        if row.state == State.QUEUED.value
    ]
    dead = dead_messages(conn, queued) if queued else set()
    consumed = workers.live_queues(conn, now) if queued else None
    out = {}
    for row, raw in found:
        queue = raw.get("queue") or default_queue
        waiting = None
        if row.state == State.QUEUED.value:
            next_attempt = (row.module, row.job_id, row.attempts + 1)
            waiting = _why_waiting(next_attempt in dead, raw, queue, consumed, now)
        due = raw.get("next_retry_at") if row.state == State.QUEUED.value else None
        out[(row.module, row.job_id)] = RowExtra(queue, _args(row.module, raw), waiting, due)
    return out


def _why_waiting(
    dead: bool, raw: Mapping[str, Any], queue: str, consumed: set[str] | None, now: datetime
) -> str | None:
    if dead:
        return "its message is dead in the outbox (the relay gave up); give it back on the overview"
    due = raw.get("next_retry_at")
    if due is not None and due > now:
        return f"not due before {due:%Y-%m-%d %H:%M:%SZ} (a retry's backoff or a countdown)"
    if consumed is not None and queue not in consumed:
        return f"no live worker consumes queue {queue!r}"
    return None


def dead_messages(
    conn: Connection, keys: Sequence[tuple[str, uuid.UUID, int]]
) -> set[tuple[str, uuid.UUID, int]]:
    """Which of the ``(module, job_id, attempt)`` messages are dead outbox rows (few:
    ``ix_outbox_dead``)."""
    cols = OUTBOX.c
    stmt = select(cols.module, cols.job_id, cols.attempt).where(
        cols.dead_at.is_not(None), tuple_(cols.module, cols.job_id, cols.attempt).in_(list(keys))
    )
    return {(module, job_id, attempt) for module, job_id, attempt in conn.execute(stmt)}


def _args(module: str, raw: Mapping[str, Any]) -> str | None:
    spec = registry.get(module)
    if spec.params_column:
        head = raw.get(spec.params_column)
        return None if head is None else str(head)
    ids = {c: raw[c] for c in spec.id_columns if c in raw}
    return json.dumps(ids, default=str, sort_keys=True, separators=(", ", ": ")) if ids else None


def _count(conn: Connection, spec: RunTable, where: Sequence[Any]) -> int:
    """Matching rows, up to COUNT_CAP + 1 (more than the cap: not exact)."""
    capped = select(spec.table.c.job_id).where(*where).limit(COUNT_CAP + 1).subquery()
    return int(conn.execute(select(func.count()).select_from(capped)).scalar_one())


def _listed_count(
    conn: Connection, spec: RunTable, where: Sequence[Any], states: Sequence[str]
) -> int:
    """The jobs list's matches, up to COUNT_CAP + 1, a state at a time as its page reads
    them (one OR over the states, capped, is a Seq Scan of the table until the cap to the
    planner when a task prefix matches most rows)."""
    total = 0
    for condition in state_conditions(spec.table, states):
        if total > COUNT_CAP:
            break
        total += _newest_count(conn, spec, [*where, condition], COUNT_CAP + 1 - total)
    return total


def _newest_count(conn: Connection, spec: RunTable, where: Sequence[Any], cap: int) -> int:
    """Rows matching ``where``, up to ``cap``, read newest first: the plan walks
    ``ix_<table>_state_updated`` (or the task's index for a rare task) and stops at the
    cap, however many rows of the table match."""
    table = spec.table
    newest = (
        select(table.c.job_id).where(*where).order_by(table.c.updated_at.desc()).limit(cap)
    ).subquery()
    return int(conn.execute(select(func.count()).select_from(newest)).scalar_one())


def _tables(wanted: JobFilter) -> list[RunTable]:
    specs = checked_tables(wanted.module)
    if wanted.attachment_id is None:
        return specs
    return [spec for spec in specs if "attachment_id" in spec.table.c]


def _matching(spec: RunTable, wanted: JobFilter, now: datetime) -> list[ColumnElement[bool]]:
    table = spec.table
    where: list[ColumnElement[bool]] = [or_(*state_conditions(table, wanted.states))]
    if wanted.task:
        # A prefix, as an operator types it ("billing." for every billing task); LIKE's
        # wildcards in it are literal.
        where.append(table.c.task_name.startswith(wanted.task, autoescape=True))
    if wanted.min_age is not None:
        where.append(table.c.updated_at <= now - timedelta(seconds=wanted.min_age))
    if wanted.max_age is not None:
        where.append(table.c.updated_at >= now - timedelta(seconds=wanted.max_age))
    if wanted.attachment_id is not None:
        where.append(table.c.attachment_id == wanted.attachment_id)
    if wanted.queue:
        named = table.c.queue == wanted.queue
        where.append(
            or_(named, table.c.queue.is_(None)) if wanted.queue == wanted.default_queue else named
        )
    return where


Keys = dict[uuid.UUID, datetime]


def _searched(
    conn: Connection,
    spec: RunTable,
    where: Sequence[Any],
    wanted: JobFilter,
    after: Cursor | None,
    limit: int,
    now: datetime,
) -> tuple[int, list[Listed]]:
    """A text search's matches in ``spec`` (up to COUNT_CAP + 1) and its page, the
    matches read once: ids that start with the text (a primary key range, at any age),
    and of the newest ``SEARCH_ROWS`` rows, shared between the states, those whose id, error
    or arguments contain it (a substring no index serves: the rows read are capped, not
    the journal's)."""
    assert wanted.text is not None
    table = spec.table
    keys: Keys = {}
    bounds = id_prefix_range(wanted.text)
    if bounds is not None:
        by_id = select(table.c.job_id, table.c.updated_at).where(
            *where, table.c.job_id.between(*bounds)
        )
        keys.update(_keys(conn, by_id))
    conditions = state_conditions(table, wanted.states)
    held = [_newest_count(conn, spec, [*where, c], SEARCH_ROWS) for c in conditions]
    for condition, share in zip(conditions, search_shares(held, SEARCH_ROWS), strict=True):
        if not share:
            continue
        recent = (
            select(table)
            .where(*where, condition)
            .order_by(table.c.updated_at.desc())
            .limit(share)
            .subquery()
        )
        matching = select(recent.c.job_id, recent.c.updated_at).where(
            _text_match(spec, wanted.text, recent.c)
        )
        keys.update(_keys(conn, matching))
    newest = sorted(
        ((at, job_id) for job_id, at in keys.items() if _before(at, job_id, after)), reverse=True
    )[:limit]
    if not newest:
        return len(keys), []
    page = _page(spec, [table.c.job_id.in_([job_id for _, job_id in newest])], None, limit)
    rows: list[Listed] = [
        (summary_row(spec, dict(r), now), dict(r)) for r in conn.execute(page).mappings()
    ]
    return len(keys), rows


def _keys(conn: Connection, stmt: Select[Any]) -> Keys:
    return {job_id: at for job_id, at in conn.execute(stmt.limit(COUNT_CAP + 1))}


def _before(at: datetime, job_id: uuid.UUID, after: Cursor | None) -> bool:
    return after is None or (at, job_id) < (after.updated_at, after.job_id)


def id_prefix_range(text: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The job ids that start with ``text`` (hex digits, dashes anywhere, as an operator
    copies a part of one) as a closed range of the primary key; None: no id prefix."""
    digits = text.replace("-", "").lower()
    if not ID_PREFIX_MIN <= len(digits) <= 32 or _HEX.fullmatch(digits) is None:
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def search_shares(held: Sequence[int], budget: int) -> list[int]:
    """How many of its newest rows each state's search reads: an equal share of
    ``budget``, and what a state holds fewer rows than its share of goes to the others.
    A small journal is read whole, a large one ``budget`` rows whatever it holds."""
    shares = [0] * len(held)
    left = budget
    # The smallest first: each takes what it holds or its share of what is left.
    for done, i in enumerate(sorted(range(len(held)), key=held.__getitem__)):
        shares[i] = min(held[i], left // (len(held) - done))
        left -= shares[i]
    return shares


def _text_match(spec: RunTable, text: str, columns: Any) -> ColumnElement[bool]:
    """job_id, the stored error, or the arguments (a generic job's params as stored, a
    domain's id columns) contain ``text``."""
    # Postgres spells a uuid with dashes, SQLite stores 32 hex digits: try both.
    job_id = cast(columns.job_id, String)
    args = [cast(columns[c], String) for c in (spec.params_column, *spec.id_columns) if c]
    return or_(
        job_id.icontains(text, autoescape=True),
        job_id.icontains(text.replace("-", ""), autoescape=True),
        columns.last_error.icontains(text, autoescape=True),
        *(arg.icontains(text, autoescape=True) for arg in args),
    )


def _page(spec: RunTable, where: Sequence[Any], after: Cursor | None, limit: int) -> Any:
    table = spec.table
    if after is not None:
        where = [
            *where,
            or_(
                table.c.updated_at < after.updated_at,
                and_(table.c.updated_at == after.updated_at, table.c.job_id < after.job_id),
            ),
        ]
    shown = [table.c[name] for name in (*_LISTED, *spec.id_columns)]
    if spec.params_column:
        shown.append(_preview(table.c[spec.params_column]))
    stmt = select(*shown, table.c.last_error)
    order = (table.c.updated_at.desc(), table.c.job_id.desc())
    return stmt.where(*where).order_by(*order).limit(limit)


def _preview(params: Any) -> Any:
    """The head of a job's arguments as text: a list never loads them whole (a job's page
    does), however large they are."""
    return func.substr(cast(params, String), 1, ARGS_PREVIEW).label(params.name)


_LISTED = (
    "job_id",
    "task_name",
    "state",
    "outcome",
    "attempts",
    "max_attempts",
    "created_at",
    "updated_at",
    "worker",
    "queue",
    "next_retry_at",
)


# ---------------------------------------------------------------------- one job


def job_detail(engine: Engine, module: str, job_id: uuid.UUID) -> JobDetail | None:
    """The run row and its whole history (its ``job_events`` rows and the enqueue, claim
    and success the row carries: ``journal.history``); None when there is no such job."""
    (spec,) = checked_tables(module)
    with engine.connect() as conn:
        run = journal.load(conn, spec, job_id)
        if run is None:
            return None
        events = [_event_row(e) for e in journal.history(conn, spec, job_id)]
    return JobDetail(spec.module, run, events, attempts_of(events))


def _event_row(row: Mapping[str, Any]) -> EventRow:
    return EventRow(
        attempt=row["attempt"],
        transition=row["transition"],
        from_state=row["from_state"],
        to_state=row["to_state"],
        actor=row["actor"],
        reason=row["reason"],
        at=row["at"],
        detail=detail_text(row.get("detail")),
    )


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
        newest = [
            found
            for spec in _tables(JobFilter(attachment_id=attachment_id))
            if (found := _newest_run(conn, spec, attachment_id)) is not None
        ]
    if not newest:
        return None
    module, run = max(newest, key=lambda found: found[1]["created_at"])
    return {
        "module": module,
        "job_id": str(run["job_id"]),
        "attempt": run["attempts"],
        "state": run["state"],
    }


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


# ---------------------------------------------------------------------- scheduled


def scheduled(
    engine: Engine, *, limit: int = PAGE_SIZE, default_queue: str = DEFAULT_QUEUE
) -> JobPage:
    """Queued jobs not due yet (a retry's backoff, a countdown, a delayed enqueue), the
    soonest first; the queued rows are read through the state index."""
    now = utcnow()
    found: list[Listed] = []
    total = 0
    with engine.connect() as conn:
        for spec in checked_tables(None):
            t = spec.table
            later = [t.c.state == State.QUEUED.value, t.c.next_retry_at > now]
            total += _count(conn, spec, later)
            stmt = _page(spec, later, None, limit).order_by(None).order_by(t.c.next_retry_at)
            found += [
                (summary_row(spec, dict(r), now), dict(r)) for r in conn.execute(stmt).mappings()
            ]
        found.sort(key=lambda r: (r[1]["next_retry_at"], r[0].job_id))
        found = found[:limit]
        extras = _extras(conn, found, default_queue, now)
    return JobPage([row for row, _ in found], total, None, total <= COUNT_CAP, extras)
