"""Every statement that writes a run row, an outbox row or a job event.

Nothing else in jobsapp writes these tables. Each transition is one guarded UPDATE (or an
INSERT that conflicts) fenced by state and attempt, plus its ``job_events`` row and, where
the transition needs a message, its ``outbox`` row, all in the caller's transaction. The
writes of a running attempt are fenced by its claim's token too (``claim_token``).

Time is the database's: a transition given no ``now`` stamps and compares with
PostgreSQL's ``now()`` inside its own statement (no extra round trip), so workers, beat
and producers with skewed clocks agree. SQLite has no clock of its own; it is one file on
one host, and the host's clock stands in (docs/lifecycle.md). An explicit ``now`` (tests,
backfills) is used as given.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cache
from typing import Any

from sqlalchemy import (
    Connection,
    CursorResult,
    Integer,
    Interval,
    Table,
    bindparam,
    func,
    insert,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import dml as pg_dml
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import dml as sqlite_dml
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError

from jobsapp import crashpoints
from jobsapp.db import UtcDateTime, is_autocommit, utcnow
from jobsapp.lifecycle import prepared
from jobsapp.lifecycle.message import build_body
from jobsapp.lifecycle.registry import RunTable
from jobsapp.lifecycle.states import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    Outcome,
    State,
    Transition,
    is_terminal,
)
from jobsapp.lifecycle.tables import JobEvent, OutboxMessage

OUTBOX: Table = OutboxMessage.__table__  # type: ignore[assignment]
EVENTS: Table = JobEvent.__table__  # type: ignore[assignment]


class EnqueueOutcome(StrEnum):
    ENQUEUED = "enqueued"
    DUPLICATE = "duplicate"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class NewJob:
    """What a producer asks for; ``values`` are the run table's own columns."""

    spec: RunTable
    job_id: uuid.UUID
    task_name: str
    concurrency_key: str
    max_attempts: int
    values: Mapping[str, Any]
    dedup_window: timedelta = timedelta(0)
    traceparent: str | None = None
    # A delayed first attempt, claimable from then on: an absolute eta (the caller's
    # clock), or a countdown counted on the database's clock.
    not_before: datetime | None = None
    delay: timedelta | None = None
    # The broker queue every attempt's message goes to (None: the app's routing decides);
    # a priority rides only the first publish (the relay republishes at the default).
    queue: str | None = None
    priority: int | None = None


@dataclass(frozen=True)
class EnqueueResult:
    outcome: EnqueueOutcome
    job_id: uuid.UUID
    message: PendingMessage | None = None
    holder: uuid.UUID | None = None


class KeyBusy(Exception):
    """Another run with the same concurrency key is active."""

    def __init__(self, holder: uuid.UUID | None) -> None:
        super().__init__(f"concurrency key held by job {holder}")
        self.holder = holder


def _upsert(conn: Connection, table: Table) -> pg_dml.Insert | sqlite_dml.Insert:
    """INSERT with the dialect's ON CONFLICT support (both spell it the same)."""
    return pg_insert(table) if conn.dialect.name == "postgresql" else sqlite_insert(table)


def _first(
    conn: Connection, stmt: Any, params: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    return _first_row(conn.execute(stmt, params))


def _first_row(result: CursorResult[Any]) -> dict[str, Any] | None:
    row = result.mappings().first()
    return None if row is None else dict(row)


def clock(conn: Connection, now: datetime | None = None) -> Any:
    """``now`` if given, else the database's clock as a SQL expression (PostgreSQL) or
    the host's (SQLite, see the module docstring)."""
    if now is not None:
        return now
    return func.now() if conn.dialect.name == "postgresql" else utcnow()


def _stamp(conn: Connection, now: datetime | None) -> datetime | None:
    """The value for a prebuilt plan's ``r_now``: None lets PostgreSQL use its now()."""
    return clock(conn, now) if now is not None or conn.dialect.name != "postgresql" else None


def _clock_param(dialect: str) -> Any:
    """A prebuilt plan's clock: ``r_now`` when bound, else PostgreSQL's now()."""
    given = bindparam("r_now", type_=UtcDateTime())
    return func.coalesce(given, func.now()) if dialect == "postgresql" else given


def _require_transaction(conn: Connection, transition: str) -> None:
    """Refuse a multi-statement transition on an autocommit connection, where a crash
    between its statements would commit a part (a row queued with no message)."""
    if is_autocommit(conn):
        raise RuntimeError(f"{transition} takes several statements: run it in a transaction")


def record_event(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    attempt: int,
    transition: Transition,
    *,
    from_state: State | None,
    to_state: State | None,
    actor: str,
    now: datetime | None = None,
    reason: str | None = None,
) -> None:
    """An event outside a guarded transition (a skip, a batch of reaped runs)."""
    event = Event(spec, attempt, transition, from_state, to_state, actor, now, reason)
    conn.execute(insert(EVENTS).values({**event.values(job_id), "at": clock(conn, now)}))


@dataclass(frozen=True)
class PendingMessage:
    """An outbox row on its way to the broker."""

    id: int
    job_id: uuid.UUID
    attempt: int
    task_name: str
    body: Mapping[str, Any]
    available_at: datetime
    publish_count: int = 0
    publish_failures: int = 0
    queue: str | None = None
    priority: int | None = None


def on_local_clock(message: PendingMessage, due_in: timedelta) -> PendingMessage:
    """``message`` for this process's fast path, due ``due_in`` from now on this process's
    clock: the broker countdown is counted on it, never against the database's."""
    return replace(message, available_at=utcnow() + due_in)


def add_outbox(
    conn: Connection,
    spec: RunTable,
    row: Mapping[str, Any],
    *,
    attempt: int,
    now: datetime,
    available_at: datetime,
) -> PendingMessage:
    """The message that starts ``attempt`` of the run in ``row``; published when due.

    An attempt that never started (cancelled while queued, then replayed) already has a
    row: it is re-armed as a fresh row, live again even if the relay had given it up, so
    the relay publishes it and any old copy still in the broker claims the same attempt.
    """
    out = outgoing(spec, row, attempt=attempt, now=now, available_at=available_at)
    values = out.values(spec.module)
    stmt = _upsert(conn, OUTBOX).values(values)
    rearm = {"body": values["body"], "created_at": now, "available_at": available_at,
             "published_at": None, "delivered_at": None, "publish_count": 0,
             "publish_failures": 0, "last_error": None, "dead_at": None,
             "queue": values["queue"]}  # fmt: skip
    upsert = stmt.on_conflict_do_update(
        index_elements=[OUTBOX.c.module, OUTBOX.c.job_id, OUTBOX.c.attempt], set_=rearm
    ).returning(OUTBOX.c.id)
    return out.pending(int(conn.execute(upsert).scalar_one()), available_at)


@dataclass(frozen=True)
class Event:
    """The ``job_events`` row a transition appends (job_id comes from the changed row)."""

    spec: RunTable
    attempt: int
    transition: Transition
    from_state: State | None
    to_state: State | None
    actor: str
    now: datetime | None  # None: the statement takes the database's clock
    reason: str | None = None
    # A failed attempt's exception: type, scrubbed message and traceback.
    detail: Mapping[str, Any] | None = None

    def values(self, job_id: Any) -> dict[str, Any]:
        return {
            "module": self.spec.module, "job_id": job_id, "attempt": self.attempt,
            "transition": self.transition.value,
            "from_state": self.from_state and self.from_state.value,
            "to_state": self.to_state and self.to_state.value,
            "actor": self.actor, "reason": self.reason, "at": self.now,
            "detail": None if self.detail is None else dict(self.detail),
        }  # fmt: skip


@dataclass(frozen=True)
class Outgoing:
    """The outbox row a transition writes for the attempt it schedules."""

    job_id: uuid.UUID
    attempt: int
    task_name: str
    body: Mapping[str, Any]
    now: datetime | None  # None: the statement takes the database's clock
    available_at: datetime | None
    queue: str | None = None

    def values(self, module: str) -> dict[str, Any]:
        return {
            "module": module, "job_id": self.job_id, "attempt": self.attempt,
            "task_name": self.task_name, "body": dict(self.body), "created_at": self.now,
            "available_at": self.available_at, "queue": self.queue,
        }  # fmt: skip

    def pending(self, outbox_id: int, available_at: datetime) -> PendingMessage:
        return PendingMessage(
            outbox_id, self.job_id, self.attempt, self.task_name, self.body, available_at,
            queue=self.queue,
        )  # fmt: skip


def outgoing(
    spec: RunTable, row: Mapping[str, Any], *, attempt: int, now: datetime | None,
    available_at: datetime | None, traceparent: str | None = None,
) -> Outgoing:  # fmt: skip
    # The body's enqueued_at is informational (nothing compares it): the process clock.
    body = build_body(
        job_id=row["job_id"], module=spec.module, attempt=attempt, ids=spec.ids_from_row(row),
        enqueued_at=now or utcnow(), traceparent=traceparent,
    )  # fmt: skip
    # Every attempt goes to the queue the producer chose, whoever writes its message.
    return Outgoing(row["job_id"], attempt, row["task_name"], body, now, available_at,
                    row.get("queue"))  # fmt: skip


# --- Prebuilt statements -----------------------------------------------------------------
# The hot transitions are built once per run table and dialect with bind parameters, so
# each call only binds values: no statement construction, no cache-key walk. Parameter
# names carry a prefix per part (r_ run row, e_ event, o_ outbox) so the parts can share
# one statement.

_EVENT_COLUMNS = ("module", "job_id", "attempt", "transition", "from_state", "to_state",
                  "actor", "reason", "at", "detail")  # fmt: skip
_OUTBOX_COLUMNS = ("module", "job_id", "attempt", "task_name", "body", "created_at",
                   "available_at", "queue")  # fmt: skip


def _bind(table: Table, column: str, prefix: str = "r_") -> Any:
    return bindparam(prefix + column, type_=table.c[column].type)


def _prefixed(values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {prefix + k: v for k, v in values.items()}


@dataclass(frozen=True)
class Plan:
    """One transition's statements: the guarded DML, then its event and outbox rows."""

    dml: Any
    event: Any
    outbox: Any | None
    combined: Any | None  # PostgreSQL: all parts as one statement


def _sequential_insert(table: Table, columns: tuple[str, ...], prefix: str) -> Any:
    return insert(table).values({c: _bind(table, c, prefix) for c in columns})


def _insert_from_changed(
    table: Table, columns: tuple[str, ...], prefix: str, derived: Mapping[str, Any]
) -> Any:
    """INSERT one row per changed run row; ``derived`` columns come from that row (its
    job_id, and its timestamps: the database's clock, read once for all parts)."""
    cols = [derived[c].label(c) if c in derived else _bind(table, c, prefix).label(c)
            for c in columns]  # fmt: skip
    return insert(table).from_select(list(columns), select(*cols))


def _available_at(row: Mapping[str, Any]) -> datetime:
    """When the message a transition wrote is due: the run's next_retry_at, else at once."""
    due = row["next_retry_at"]
    return due if isinstance(due, datetime) else row["updated_at"]


def _plan(dialect: str, dml: Any, with_outbox: bool) -> Plan:
    event = _sequential_insert(EVENTS, _EVENT_COLUMNS, "e_")
    outbox = _sequential_insert(OUTBOX, _OUTBOX_COLUMNS, "o_").returning(OUTBOX.c.id)
    if dialect != "postgresql":
        return Plan(dml, event, outbox if with_outbox else None, None)
    changed = dml.cte("changed")
    at = changed.c.updated_at
    combined = select(changed)
    if with_outbox:
        due = func.coalesce(changed.c.next_retry_at, at)
        ob = _insert_from_changed(OUTBOX, _OUTBOX_COLUMNS, "o_", {
            "job_id": changed.c.job_id, "created_at": at, "available_at": due})  # fmt: skip
        ob_cte = ob.returning(OUTBOX.c.id).cte("ob")
        combined = select(changed, select(ob_cte.c.id).scalar_subquery().label("_outbox_id"))
    ev = _insert_from_changed(EVENTS, _EVENT_COLUMNS, "e_", {"job_id": changed.c.job_id,
                                                             "at": at})  # fmt: skip
    return Plan(dml, event, outbox, combined.add_cte(ev.cte("ev")))


def _run(
    conn: Connection, plan: Plan, params: dict[str, Any], event: Event, out: Outgoing | None
) -> tuple[dict[str, Any] | None, PendingMessage | None]:
    """Run a plan: on PostgreSQL one statement (one round trip, atomic even in autocommit),
    elsewhere its parts in sequence in the caller's transaction."""
    params = {**params, **_prefixed(event.values(None), "e_")}
    if out is not None:
        params |= _prefixed(out.values(event.spec.module), "o_")
    if plan.combined is not None:
        row = _first_row(prepared.execute(conn, plan.combined, params))
        if row is None:
            return None, None
        outbox_id = row.pop("_outbox_id", None)
        if out is None or not outbox_id:
            return row, None
        return row, out.pending(int(outbox_id), _available_at(row))
    row = _first(conn, plan.dml, params)
    if row is None:
        return None, None
    conn.execute(plan.event, {**params, "e_job_id": row["job_id"]})
    if out is None or plan.outbox is None:
        return row, None
    outbox_id = conn.execute(plan.outbox, {**params, "o_job_id": row["job_id"]}).scalar_one()
    return row, out.pending(int(outbox_id), _available_at(row))


def _row_columns(spec: RunTable) -> tuple[str, ...]:
    return tuple(c.name for c in spec.table.c)


def _delay_param() -> Any:
    return bindparam("r_delay", type_=Interval())


@cache
def _insert_plan(spec: RunTable, dialect: str, state: State) -> Plan:
    """none -> queued (an enqueue, with its outbox row) or running (a foreign claim)."""
    table = spec.table
    insert_stmt = pg_insert(table) if dialect == "postgresql" else sqlite_insert(table)
    values = {c: _bind(table, c) for c in _row_columns(spec)}
    if dialect == "postgresql":
        now = _clock_param(dialect)
        start = func.coalesce(values["next_retry_at"], now + _delay_param())
        values |= {"created_at": now, "updated_at": now, "next_retry_at": start}
        if state is State.RUNNING:
            values |= {"started_at": now, "heartbeat_at": now}
    # An enqueue's caller needs only when its message is due; a foreign claim's worker
    # needs the whole row it runs.
    queued = (table.c.job_id, table.c.next_retry_at, table.c.updated_at)
    returned = queued if state is State.QUEUED else tuple(table.c)
    dml = insert_stmt.values(values).on_conflict_do_nothing().returning(*returned)
    return _plan(dialect, dml, with_outbox=state is State.QUEUED)


def _fence_params(table: Table) -> tuple[Any, ...]:
    """The fence of a running attempt's writes: its attempt, and the token of the claim
    that took it (two claims of one attempt exist once a database crash lost the first)."""
    return (
        table.c.job_id == _bind(table, "job_id"),
        table.c.state == State.RUNNING.value,
        table.c.attempts == _bind(table, "attempts"),
        table.c.claim_token == _bind(table, "claim_token"),
    )


@cache
def _claim_plan(spec: RunTable, dialect: str) -> Plan:
    table = spec.table
    now = _clock_param(dialect)
    dml = (
        update(table)
        .where(
            table.c.job_id == _bind(table, "job_id"),
            table.c.state == State.QUEUED.value,
            table.c.attempts == bindparam("r_previous", type_=table.c.attempts.type),
            or_(table.c.next_retry_at.is_(None), table.c.next_retry_at <= now),
        )
        .values(
            state=State.RUNNING.value, attempts=_bind(table, "attempts"), started_at=now,
            heartbeat_at=now, next_retry_at=None, worker=_bind(table, "worker"), updated_at=now,
            claim_token=_bind(table, "claim_token"),
        )
        .returning(*table.c)
    )  # fmt: skip
    return _plan(dialect, dml, with_outbox=False)


@cache
def _finish_plan(spec: RunTable, dialect: str) -> Plan:
    table = spec.table
    now = _clock_param(dialect)
    dml = (
        update(table)
        .where(*_fence_params(table))
        .values(
            state=_bind(table, "state"), outcome=_bind(table, "outcome"),
            last_error=_bind(table, "last_error"), finished_at=now, updated_at=now,
            next_retry_at=None,
        )
        .returning(table.c.job_id, table.c.updated_at)
    )  # fmt: skip
    return _plan(dialect, dml, with_outbox=False)


@cache
def _requeue_plan(spec: RunTable, dialect: str) -> Plan:
    table = spec.table
    now = _clock_param(dialect)
    due = _bind(table, "next_retry_at")
    if dialect == "postgresql":
        due = func.coalesce(due, now + _delay_param())
    dml = (
        update(table)
        .where(*_fence_params(table))
        .values(
            state=State.QUEUED.value, next_retry_at=due, last_error=_bind(table, "last_error"),
            heartbeat_at=None, updated_at=now,
            max_attempts=table.c.max_attempts + bindparam("r_refund", type_=Integer()),
        )
        .returning(*table.c)
    )  # fmt: skip
    return _plan(dialect, dml, with_outbox=True)


@cache
def _heartbeat_stmt(spec: RunTable, dialect: str) -> Any:
    table = spec.table
    return update(table).where(*_fence_params(table)).values(heartbeat_at=_clock_param(dialect))


def _later(now: datetime | None, delay: timedelta | None) -> datetime | None:
    """``now + delay`` where Python knows ``now`` (else the statement adds it)."""
    return None if now is None or delay is None else now + delay


def _new_row(job: NewJob, now: datetime | None, state: State, attempts: int) -> dict[str, Any]:
    running = state is State.RUNNING
    return {
        "job_id": job.job_id,
        "task_name": job.task_name,
        "concurrency_key": job.concurrency_key,
        "state": state.value,
        "attempts": attempts,
        "max_attempts": job.max_attempts,
        "rescues": 0,
        "next_retry_at": job.not_before or _later(now, job.delay),
        "started_at": now if running else None,
        "heartbeat_at": now if running else None,
        "created_at": now,
        "updated_at": now,
        "outcome": None,
        "last_error": None,
        "finished_at": None,
        "worker": None,
        "queue": job.queue,
        "claim_token": new_claim_token() if running else None,
        **job.values,
    }


def _insert_params(row: Mapping[str, Any], now: datetime | None, job: NewJob) -> dict[str, Any]:
    return {**_prefixed(row, "r_"), "r_now": now, "r_delay": job.delay}


def enqueue(
    conn: Connection, job: NewJob, *, actor: str, now: datetime | None = None
) -> EnqueueResult:
    """none -> queued; a known job_id is a duplicate (or a rerun past its dedup window).

    ``conn`` is in a transaction: a rerun takes several statements.
    """
    inserted = enqueue_new(conn, job, now=now, actor=actor)
    return inserted or enqueue_existing(conn, job, now=now, actor=actor)


def enqueue_new(
    conn: Connection, job: NewJob, *, actor: str, now: datetime | None = None
) -> EnqueueResult | None:
    """none -> queued in one statement (autocommit allowed); None if the job_id or the
    concurrency key is taken: ``enqueue_existing`` then decides, in a transaction."""
    now = _stamp(conn, now)
    row = _new_row(job, now, State.QUEUED, 0)
    plan = _insert_plan(job.spec, conn.dialect.name, State.QUEUED)
    event = Event(job.spec, 1, Transition.ENQUEUE, None, State.QUEUED, actor, now)
    out = outgoing(job.spec, row, attempt=1, now=now, available_at=row["next_retry_at"] or now,
                   traceparent=job.traceparent)  # fmt: skip
    inserted, message = _run(conn, plan, _insert_params(row, now, job), event, out)
    if inserted is None:
        return None
    return EnqueueResult(EnqueueOutcome.ENQUEUED, job.job_id, message=message)


def active_holder(conn: Connection, spec: RunTable, key: str) -> uuid.UUID | None:
    table = spec.table
    stmt = select(table.c.job_id).where(
        table.c.concurrency_key == key, table.c.state.in_(ACTIVE_STATES)
    )
    found = conn.execute(stmt).scalar()
    return found if isinstance(found, uuid.UUID) else None


def enqueue_existing(
    conn: Connection, job: NewJob, *, actor: str, now: datetime | None = None
) -> EnqueueResult:
    """The answer to an enqueue whose insert conflicted: duplicate, skipped, or a rerun."""
    table = job.spec.table
    seen = conn.execute(
        select(table.c.state, table.c.attempts).where(table.c.job_id == job.job_id)
    ).first()
    if seen is None:
        holder = active_holder(conn, job.spec, job.concurrency_key)
        return EnqueueResult(EnqueueOutcome.SKIPPED, job.job_id, holder=holder)
    if not is_terminal(seen.state):
        return EnqueueResult(EnqueueOutcome.DUPLICATE, job.job_id)
    try:
        message = reopen(
            conn, job.spec, job.job_id,
            from_state=State(seen.state), attempts=seen.attempts, budget=job.max_attempts,
            transition=Transition.RERUN, now=now, actor=actor, reason="enqueued again",
            finished_before=job.dedup_window,
        )  # fmt: skip
    except KeyBusy as busy:
        return EnqueueResult(EnqueueOutcome.SKIPPED, job.job_id, holder=busy.holder)
    if message is None:
        return EnqueueResult(EnqueueOutcome.DUPLICATE, job.job_id)
    return EnqueueResult(EnqueueOutcome.ENQUEUED, job.job_id, message=message)


# --- Many enqueues at once (the batch path) ------------------------------------------------
# A batch writes its jobs with one multi-row statement per table (SQLAlchemy's
# "insertmanyvalues" renders an executemany as INSERT ... VALUES (...), (...) ...), and
# answers each job as the same enqueues one by one, in order, in that transaction would.

_EVENTS_INSERT = insert(EVENTS)
_OUTBOX_INSERT = insert(OUTBOX).returning(OUTBOX.c.id, OUTBOX.c.job_id)


def enqueue_many(
    conn: Connection, jobs: Sequence[NewJob], *, actor: str, now: datetime | None = None
) -> list[EnqueueResult]:
    """none -> queued for every job, answered in ``jobs``' order as ``enqueue`` would.

    ``conn`` is in a transaction: the rows of every table commit together or not at all.
    """
    _require_transaction(conn, "enqueue_many")
    results: dict[int, EnqueueResult] = {}
    for spec in dict.fromkeys(job.spec for job in jobs):
        positions = [i for i, job in enumerate(jobs) if job.spec is spec]
        answers = _enqueue_into(conn, spec, [jobs[i] for i in positions], actor, now)
        results.update(zip(positions, answers, strict=True))
    return [results[i] for i in range(len(jobs))]


def _enqueue_into(
    conn: Connection, spec: RunTable, jobs: Sequence[NewJob], actor: str, now: datetime | None
) -> list[EnqueueResult]:
    # One job: its one-statement plan. A rerun takes its key at its turn, ahead of any later
    # job of the batch: one by one.
    if len(jobs) == 1 or _finished_among(conn, spec, jobs):
        return [enqueue(conn, job, actor=actor, now=now) for job in jobs]
    now = _stamp(conn, now)
    rows = [_new_row(job, now, State.QUEUED, 0) for job in jobs]
    params = [_insert_params(row, now, job) for row, job in zip(rows, jobs, strict=True)]
    result = conn.execute(_many_insert(spec, conn.dialect.name), params)
    inserted = [dict(row) for row in result.mappings()]
    # The run as inserted: what the producer wrote, with the database's clock readings.
    won = {i: {**rows[i], **row} for i, row in _winners(jobs, inserted).items()}
    messages = _events_and_outbox(conn, spec, jobs, won, actor)
    answers = {i: EnqueueResult(EnqueueOutcome.ENQUEUED, jobs[i].job_id, message=m)
               for i, m in messages.items()}  # fmt: skip
    answers |= _conflicts(conn, spec, jobs, won, actor, now)
    return [answers[i] for i in range(len(jobs))]


@cache
def _many_insert(spec: RunTable, dialect: str) -> Any:
    """The enqueue's INSERT, also returning the key: a batch tells twins apart by it."""
    plan = _insert_plan(spec, dialect, State.QUEUED)
    return plan.dml.returning(spec.table.c.concurrency_key)


def _finished_among(conn: Connection, spec: RunTable, jobs: Sequence[NewJob]) -> bool:
    table = spec.table
    stmt = select(table.c.job_id).where(
        table.c.job_id.in_([job.job_id for job in jobs]), table.c.state.in_(TERMINAL_STATES)
    )
    return conn.execute(stmt.limit(1)).first() is not None


def _winners(
    jobs: Sequence[NewJob], inserted: Sequence[Mapping[str, Any]]
) -> dict[int, Mapping[str, Any]]:
    """Position -> inserted row: the first job with the row's job_id and key (rows are
    inserted in the statement's order, so a later twin conflicted with it)."""
    first: dict[tuple[uuid.UUID, str], int] = {}
    for i, job in enumerate(jobs):
        first.setdefault((job.job_id, job.concurrency_key), i)
    return {first[(row["job_id"], row["concurrency_key"])]: row for row in inserted}


def _events_and_outbox(
    conn: Connection, spec: RunTable, jobs: Sequence[NewJob],
    won: Mapping[int, Mapping[str, Any]], actor: str,
) -> dict[int, PendingMessage]:  # fmt: skip
    """The enqueue event and first message of every inserted run, stamped with the run's
    own clock reading, in one statement each."""
    if not won:
        return {}
    outgoing_by_position: dict[int, Outgoing] = {}
    events = []
    for i, row in won.items():
        at = row["updated_at"]
        event = Event(spec, 1, Transition.ENQUEUE, None, State.QUEUED, actor, at)
        events.append(event.values(row["job_id"]))
        outgoing_by_position[i] = outgoing(spec, row, attempt=1, now=at,
                                           available_at=_available_at(row),
                                           traceparent=jobs[i].traceparent)  # fmt: skip
    conn.execute(_EVENTS_INSERT, events)
    values = [out.values(spec.module) for out in outgoing_by_position.values()]
    by_job = {job_id: int(outbox_id) for outbox_id, job_id in conn.execute(_OUTBOX_INSERT, values)}
    return {i: out.pending(by_job[out.job_id], _available_at(won[i]))
            for i, out in outgoing_by_position.items()}  # fmt: skip


def _conflicts(
    conn: Connection, spec: RunTable, jobs: Sequence[NewJob],
    won: Mapping[int, Mapping[str, Any]], actor: str, now: datetime | None,
) -> dict[int, EnqueueResult]:  # fmt: skip
    """The answer for each job whose insert conflicted: DUPLICATE when its job_id was
    taken at its turn, else SKIPPED with the key's holder."""
    lost = [i for i in range(len(jobs)) if i not in won]
    if not lost:
        return {}
    inserted_at = {jobs[i].job_id: i for i in sorted(won, reverse=True)}
    states = _states(conn, spec, [jobs[i].job_id for i in lost])
    holders = _holders(conn, spec, [jobs[i].concurrency_key for i in lost])
    answers: dict[int, EnqueueResult] = {}
    for i in lost:
        job = jobs[i]
        kind = conflict_outcome(i, inserted_at.get(job.job_id), states.get(job.job_id))
        if kind is None:
            answers[i] = enqueue_existing(conn, job, actor=actor, now=now)
        else:
            holder = holders.get(job.concurrency_key) if kind is EnqueueOutcome.SKIPPED else None
            answers[i] = EnqueueResult(kind, job.job_id, holder=holder)
    return answers


def conflict_outcome(position: int, turn: int | None, state: str | None) -> EnqueueOutcome | None:
    """What the conflicted insert of a batch's job at ``position`` means.

    ``turn`` is where the batch itself inserted that job_id (None: it did not), ``state``
    the row's state otherwise (None: no row). The job_id existed at the job's turn:
    DUPLICATE; it did not, so only the key was taken: SKIPPED. None for a finished row
    (inserted and finished by others since the batch looked): a rerun, which
    ``enqueue_existing`` decides.
    """
    if turn is not None:
        return EnqueueOutcome.DUPLICATE if turn < position else EnqueueOutcome.SKIPPED
    if state is None:
        return EnqueueOutcome.SKIPPED
    return EnqueueOutcome.DUPLICATE if state in ACTIVE_STATES else None


def _states(conn: Connection, spec: RunTable, job_ids: Sequence[uuid.UUID]) -> dict[Any, str]:
    table = spec.table
    stmt = select(table.c.job_id, table.c.state).where(table.c.job_id.in_(job_ids))
    return {key: value for key, value in conn.execute(stmt)}


def _holders(conn: Connection, spec: RunTable, keys: Sequence[str]) -> dict[str, Any]:
    """The active run holding each of ``keys`` (at most one each: the partial index)."""
    table = spec.table
    stmt = select(table.c.concurrency_key, table.c.job_id).where(
        table.c.concurrency_key.in_(keys), table.c.state.in_(ACTIVE_STATES)
    )
    return {key: value for key, value in conn.execute(stmt)}


def reopen(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    *,
    from_state: State,
    attempts: int,
    budget: int,
    transition: Transition,
    actor: str,
    reason: str,
    now: datetime | None = None,
    finished_before: timedelta | None = None,
) -> PendingMessage | None:
    """terminal -> queued as a new attempt of the same job; None if the row moved on, or
    finished less than ``finished_before`` ago (a dedup window, on the database's clock).

    Raises KeyBusy when another run holds the concurrency key. A savepoint keeps that
    conflict from aborting the caller's transaction, which must exist: the move, its
    event, the domain's mirror and the next attempt's message commit together or not at all.
    """
    _require_transaction(conn, "reopen")
    table = spec.table
    at = clock(conn, now)
    guard = [table.c.job_id == job_id, table.c.state == from_state.value,
             table.c.attempts == attempts]  # fmt: skip
    if finished_before is not None:
        guard.append(table.c.finished_at <= at - finished_before)
    stmt = (
        update(table)
        .where(*guard)
        .values(
            state=State.QUEUED.value, outcome=None, finished_at=None, heartbeat_at=None,
            next_retry_at=None, max_attempts=table.c.attempts + budget, rescues=0,
            updated_at=at,
        )
        .returning(*table.c)
    )  # fmt: skip
    try:
        with conn.begin_nested():
            row = _first(conn, stmt)
    except IntegrityError:
        key = conn.execute(select(table.c.concurrency_key).where(table.c.job_id == job_id))
        raise KeyBusy(active_holder(conn, spec, key.scalar_one())) from None
    if row is None:
        return None
    crashpoints.hit("reopen_after_update")
    at = row["updated_at"]  # the database's clock, read by the UPDATE itself
    record_event(
        conn, spec, job_id, attempts + 1, transition,
        from_state=from_state, to_state=State.QUEUED, actor=actor, now=at, reason=reason,
    )  # fmt: skip
    spec.changed(conn, transition, [row])
    return add_outbox(conn, spec, row, attempt=attempts + 1, now=at, available_at=at)


def new_claim_token() -> uuid.UUID:
    """A claim's token: made here, not by the database, so the claim's statement (and its
    prepared plan) stays as it was, and unique to the claim whatever befalls the journal."""
    return uuid.uuid4()


def claim(
    conn: Connection, spec: RunTable, job_id: uuid.UUID, attempt: int, *, worker: str,
    now: datetime | None = None,
) -> Mapping[str, Any] | None:  # fmt: skip
    """queued -> running, only for the next attempt and only once it is due; the row
    returned carries the claim's ``claim_token``, which every later write must name."""
    now = _stamp(conn, now)
    params = {"r_job_id": job_id, "r_previous": attempt - 1, "r_attempts": attempt,
              "r_now": now, "r_worker": worker, "r_claim_token": new_claim_token()}  # fmt: skip
    event = Event(spec, attempt, Transition.CLAIM, State.QUEUED, State.RUNNING, worker, now)
    return _run(conn, _claim_plan(spec, conn.dialect.name), params, event, None)[0]


def claim_by_insert(
    conn: Connection, job: NewJob, attempt: int, *, worker: str, now: datetime | None = None
) -> Mapping[str, Any] | None:
    """A foreign producer's message (no row): insert the run as running under the index."""
    now = _stamp(conn, now)
    row = {**_new_row(job, now, State.RUNNING, attempt), "worker": worker}
    plan = _insert_plan(job.spec, conn.dialect.name, State.RUNNING)
    event = Event(
        job.spec, attempt, Transition.CLAIM, None, State.RUNNING, worker, now,
        reason="claimed by insert: message from a producer without a journal row",
    )  # fmt: skip
    return _run(conn, plan, _insert_params(row, now, job), event, None)[0]


def load(conn: Connection, spec: RunTable, job_id: uuid.UUID) -> Mapping[str, Any] | None:
    table = spec.table
    return _first(conn, select(table).where(table.c.job_id == job_id))


def snoozes(conn: Connection, spec: RunTable, job_id: uuid.UUID) -> int:
    """Long Retry-After pauses since the job was last (re)started: its ``snooze`` events
    from the attempt its last rerun or replay opened (derived, no counter column)."""
    mine = (EVENTS.c.module == spec.module, EVENTS.c.job_id == job_id)
    reopened = select(func.coalesce(func.max(EVENTS.c.attempt), 0)).where(
        *mine, EVENTS.c.transition.in_((Transition.RERUN.value, Transition.REPLAY.value))
    )
    stmt = select(func.count()).where(
        *mine, EVENTS.c.transition == Transition.SNOOZE.value,
        EVENTS.c.attempt >= reopened.scalar_subquery(),
    )  # fmt: skip
    return int(conn.execute(stmt).scalar_one())


def load_with_clock(
    conn: Connection, spec: RunTable, job_id: uuid.UUID
) -> tuple[Mapping[str, Any] | None, datetime]:
    """The row and the database's clock, read in one statement."""
    if conn.dialect.name != "postgresql":
        return load(conn, spec, job_id), utcnow()
    table = spec.table
    stmt = select(table, func.now().label("_db_now")).where(table.c.job_id == job_id)
    row = _first(conn, stmt)
    if row is None:
        return None, utcnow()  # no row: nothing to time
    return row, row.pop("_db_now")


def heartbeat(
    conn: Connection, spec: RunTable, job_id: uuid.UUID, attempt: int, *, token: uuid.UUID,
    now: datetime | None = None,
) -> bool:  # fmt: skip
    """running -> running under the claim ``token``; False means the lease is lost."""
    params = {"r_job_id": job_id, "r_attempts": attempt, "r_claim_token": token,
              "r_now": _stamp(conn, now)}  # fmt: skip
    return conn.execute(_heartbeat_stmt(spec, conn.dialect.name), params).rowcount == 1


def _finish(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    attempt: int,
    *,
    token: uuid.UUID,
    transition: Transition,
    outcome: Outcome,
    error: str | None,
    actor: str,
    now: datetime | None,
    detail: Mapping[str, Any] | None = None,
) -> bool:
    now = _stamp(conn, now)
    state = State.SUCCEEDED if outcome is Outcome.SUCCEEDED else State.FAILED
    params = {"r_job_id": job_id, "r_attempts": attempt, "r_claim_token": token,
              "r_state": state.value, "r_outcome": outcome.value, "r_last_error": error,
              "r_now": now}  # fmt: skip
    event = Event(spec, attempt, transition, State.RUNNING, state, actor, now, error, detail)
    return _run(conn, _finish_plan(spec, conn.dialect.name), params, event, None)[0] is not None


def succeed(
    conn: Connection, spec: RunTable, job_id: uuid.UUID, attempt: int, *, token: uuid.UUID,
    actor: str, now: datetime | None = None,
) -> bool:  # fmt: skip
    """running -> succeeded, fenced by the attempt and its claim ``token``; False means
    the lease was lost."""
    return _finish(
        conn, spec, job_id, attempt, token=token, transition=Transition.SUCCEED,
        outcome=Outcome.SUCCEEDED, error=None, actor=actor, now=now,
    )  # fmt: skip


def fail(
    conn: Connection, spec: RunTable, job_id: uuid.UUID, attempt: int, *, token: uuid.UUID,
    outcome: Outcome, error: str, actor: str, now: datetime | None = None,
    detail: Mapping[str, Any] | None = None,
) -> bool:  # fmt: skip
    """running -> failed with ``outcome``, fenced as ``succeed``; ``detail`` goes on its
    event."""
    return _finish(
        conn, spec, job_id, attempt, token=token, transition=Transition.FAIL,
        outcome=outcome, error=error, actor=actor, now=now, detail=detail,
    )  # fmt: skip


def requeue(
    conn: Connection, spec: RunTable, run: Mapping[str, Any], *, error: str,
    transition: Transition, actor: str, delay: timedelta | None = None,
    retry_at: datetime | None = None, now: datetime | None = None, refund: bool = False,
    detail: Mapping[str, Any] | None = None,
) -> PendingMessage | None:  # fmt: skip
    """running -> queued for the next attempt, due ``delay`` after the database's now (or
    at ``retry_at``); returns its outbox row.

    ``run`` is the row as claimed (the fence is its ``attempts`` and ``claim_token``).
    ``refund`` (a long Retry-After) raises the ceiling by one, so the pause does not spend
    an attempt while ``attempts`` itself still only grows.
    """
    now = _stamp(conn, now)
    attempt = int(run["attempts"])
    due = retry_at or _later(now, delay or timedelta(0))
    params = {"r_job_id": run["job_id"], "r_attempts": attempt,
              "r_claim_token": run["claim_token"], "r_next_retry_at": due,
              "r_delay": delay or timedelta(0), "r_last_error": error, "r_now": now,
              "r_refund": int(refund)}  # fmt: skip
    event = Event(spec, attempt, transition, State.RUNNING, State.QUEUED, actor, now, error,
                  detail)  # fmt: skip
    out = outgoing(spec, run, attempt=attempt + 1, now=now, available_at=due)
    return _run(conn, _requeue_plan(spec, conn.dialect.name), params, event, out)[1]


def cancel(
    conn: Connection, spec: RunTable, job_id: uuid.UUID, *, attempts: int, actor: str,
    reason: str, now: datetime | None = None,
) -> bool:  # fmt: skip
    """queued -> failed/cancelled by an operator, fenced by the ``attempts`` the operator
    saw (a retry that ran meanwhile is another attempt); a running job must finish or be
    reaped."""
    _require_transaction(conn, "cancel")
    table = spec.table
    at = clock(conn, now)
    stmt = (
        update(table)
        .where(table.c.job_id == job_id, table.c.state == State.QUEUED.value,
               table.c.attempts == attempts)
        .values(
            state=State.FAILED.value, outcome=Outcome.CANCELLED.value, finished_at=at,
            updated_at=at, next_retry_at=None, last_error=reason,
        )
        .returning(*table.c)
    )  # fmt: skip
    row = _first(conn, stmt)
    if row is None:
        return False
    record_event(
        conn, spec, job_id, attempts + 1, Transition.CANCEL, from_state=State.QUEUED,
        to_state=State.FAILED, actor=actor, now=row["updated_at"], reason=reason,
    )  # fmt: skip
    spec.changed(conn, Transition.CANCEL, [row])
    return True


@dataclass(frozen=True)
class StaleRun:
    job_id: uuid.UUID
    attempt: int
    rescues: int
    max_attempts: int
    task_name: str
    ids: Mapping[str, Any]
    queue: str | None = None


def find_stale(
    conn: Connection, spec: RunTable, *, cutoff: datetime, limit: int,
    skip: Collection[uuid.UUID] = (),
) -> list[StaleRun]:  # fmt: skip
    """Running rows whose heartbeat is older than ``cutoff``, oldest first, locked.

    ``skip`` names runs this pass already found blocked, so they do not fill every batch.
    """
    table = spec.table
    stmt = (
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
    return [
        StaleRun(
            job_id=r["job_id"], attempt=r["attempts"], rescues=r["rescues"],
            max_attempts=r["max_attempts"], task_name=r["task_name"],
            ids=spec.ids_from_row(dict(r)), queue=r["queue"],
        )
        for r in conn.execute(stmt).mappings()
    ]  # fmt: skip


def reap(
    conn: Connection, spec: RunTable, runs: Sequence[StaleRun], *, requeue_them: bool,
    cutoff: datetime, reason: str, now: datetime,
) -> list[StaleRun]:  # fmt: skip
    """One batched, guarded write: still running, same attempt, heartbeat still stale."""
    if not runs:
        return []
    table = spec.table
    values: dict[str, Any] = {"updated_at": now, "last_error": reason, "heartbeat_at": None}
    if requeue_them:
        values |= {"state": State.QUEUED.value, "next_retry_at": None,
                   "rescues": table.c.rescues + 1}  # fmt: skip
    else:
        values |= {"state": State.FAILED.value, "outcome": Outcome.STALE.value,
                   "finished_at": now}  # fmt: skip
    stmt = (
        update(table)
        .where(
            table.c.state == State.RUNNING.value,
            table.c.heartbeat_at < cutoff,
            tuple_(table.c.job_id, table.c.attempts).in_([(r.job_id, r.attempt) for r in runs]),
        )
        .values(**values)
        .returning(table.c.job_id)
    )
    done = set(conn.execute(stmt).scalars())
    reaped = [r for r in runs if r.job_id in done]
    _after_reap(conn, spec, reaped, requeued=requeue_them, reason=reason, now=now)
    return reaped


def _after_reap(
    conn: Connection, spec: RunTable, reaped: Sequence[StaleRun], *, requeued: bool,
    reason: str, now: datetime,
) -> None:  # fmt: skip
    to_state = State.QUEUED if requeued else State.FAILED
    transition = Transition.REAP_REQUEUE if requeued else Transition.REAP_FAIL
    for run in reaped:
        record_event(
            conn, spec, run.job_id, run.attempt, transition,
            from_state=State.RUNNING, to_state=to_state, actor="reaper", now=now, reason=reason,
        )  # fmt: skip
        if requeued:
            row = {"job_id": run.job_id, "task_name": run.task_name, "queue": run.queue,
                   **run.ids}  # fmt: skip
            add_outbox(conn, spec, row, attempt=run.attempt + 1, now=now, available_at=now)
    spec.changed(conn, transition, [{"job_id": r.job_id, **r.ids} for r in reaped])
