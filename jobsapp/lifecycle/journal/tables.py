"""The lifecycle schema: the run-table contract (a mixin), the outbox, leases and events.

Each domain keeps its runs in its own table built from ``RunMixin``; ``job_runs`` is the
home of tasks that declare no domain table. Only ``jobsapp.lifecycle.journal`` writes
these rows.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Float,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    literal_column,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column

from jobsapp.db import UtcDateTime
from jobsapp.lifecycle.rules.states import ACTIVE_STATES, ALL_STATES, TERMINAL_STATES

# SQLite only autoincrements an INTEGER PRIMARY KEY (the rowid alias).
BigId = BigInteger().with_variant(Integer(), "sqlite")


def _in_list(states: tuple[str, ...]) -> str:
    return ", ".join(f"'{s}'" for s in states)


ACTIVE_SQL = f"state IN ({_in_list(ACTIVE_STATES)})"
# The one-run-per-key index covers the runs of tasks with no ``limit``; a limited task's
# runs share their key through ``key_slots`` instead (journal/key_slots.py).
EXCLUSIVE_SQL = f"{ACTIVE_SQL} AND key_limit IS NULL"
# Queued runs not due yet: a retry's backoff, a countdown, a parked run of a limited key.
SCHEDULED_SQL = "state = 'queued' AND next_retry_at IS NOT NULL"
EXPIRING_SQL = "state = 'queued' AND expires_at IS NOT NULL"
# The relay's two working sets of outbox rows; a dead row is in neither.
OUTBOX_PENDING_SQL = "published_at IS NULL AND dead_at IS NULL"
OUTBOX_INFLIGHT_SQL = "published_at IS NOT NULL AND delivered_at IS NULL AND dead_at IS NULL"


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UtcDateTime, dict[str, Any]: JSON}


class RunMixin:
    """The columns and guards every run table shares (docs/lifecycle.md)."""

    job_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    task_name: Mapped[str] = mapped_column(String(200))
    concurrency_key: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16))
    outcome: Mapped[str | None] = mapped_column(String(32))
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    max_attempts: Mapped[int] = mapped_column(Integer)
    rescues: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    heartbeat_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    next_retry_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    updated_at: Mapped[datetime]
    worker: Mapped[str | None] = mapped_column(String(200))
    # The claim's own token, new at every claim: every write of the running attempt is
    # fenced by it, so a claim a database crash lost is never taken for a later claim of
    # the same attempt number (docs/lifecycle.md, "The claim fence").
    claim_token: Mapped[uuid.UUID | None]
    # The broker queue the producer chose (apply_async(queue=...), a task's queue); NULL is
    # the app's default. Every message of the job, republished or retried, goes there.
    queue: Mapped[str | None] = mapped_column(String(200))
    # What the body of the succeeded attempt returned (JSON, bounded by
    # JOBSAPP_RESULT_MAX_BYTES); NULL otherwise, and for a body that returned None.
    result: Mapped[Any | None] = mapped_column(JSON(none_as_null=True))
    # Celery's ``expires``: past it, an attempt still queued never runs (outcome
    # ``expired``); every attempt of the job shares it, as a Celery task's retries do.
    expires_at: Mapped[datetime | None]
    # A revoke or cancel of the running attempt, asked for and not yet honoured: the
    # attempt's heartbeat stops the body, and its success is refused (journal/revoking.py).
    cancel_requested_at: Mapped[datetime | None]
    # The canvas (chain, group, chord, link) this run is a step of (``workflow_steps``);
    # NULL for a job of its own. The finish statement returns it, so only a step's finish
    # looks for what comes next.
    workflow_id: Mapped[uuid.UUID | None]
    # The task's ``limit`` (or ``fair`` window): NULL for one active run per key (the
    # unique index); N >= 1 for at most N holders of the key's slots (``key_slots``).
    key_limit: Mapped[int | None] = mapped_column(Integer)
    # The happy path kept on the row instead of event rows (journal/row_events.py): who
    # enqueued the job, and when the current attempt was claimed. NULL on rows whose
    # enqueue and claim were journaled as events (before migration 0015, a foreign claim).
    enqueued_by: Mapped[str | None] = mapped_column(String(200))
    attempted_at: Mapped[datetime | None]
    # Celery's ``priority`` of the job (NULL: none given): every message of the job carries
    # it, a retry's and a republish's too (docs/flow-control.md, "Priorities").
    priority: Mapped[int | None] = mapped_column(SmallInteger)
    # Celery's ``time_limit``/``soft_time_limit`` of one call (``apply_async``; NULL: the
    # task's own): every message of the job carries them, as ``priority``.
    time_limit: Mapped[float | None] = mapped_column(Float)
    soft_time_limit: Mapped[float | None] = mapped_column(Float)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[Any, ...]:  # noqa: N805 - SQLAlchemy passes the class
        name = cls.__tablename__  # type: ignore[attr-defined]
        return (
            CheckConstraint(f"state IN ({_in_list(ALL_STATES)})", name=f"ck_{name}_state"),
            CheckConstraint(
                f"state NOT IN ({_in_list(TERMINAL_STATES)}) OR finished_at IS NOT NULL",
                name=f"ck_{name}_terminal_finished",
            ),
            CheckConstraint(
                "state <> 'running' OR heartbeat_at IS NOT NULL",
                name=f"ck_{name}_running_heartbeat",
            ),
            CheckConstraint(
                "attempts >= 0 AND max_attempts >= 1 AND rescues >= 0",
                name=f"ck_{name}_counters",
            ),
            CheckConstraint("key_limit IS NULL OR key_limit >= 1", name=f"ck_{name}_key_limit"),
            *run_table_indexes(name),
        )


def run_table_indexes(name: str) -> tuple[Index, ...]:
    """The indexes of run table ``name``: the model's, and what ``ddl.create_run_table``
    creates for a domain's new table (tests/integration/test_schema.py)."""
    return (
        # The mutual exclusion of the contract: one active run per key.
        _partial(f"uq_{name}_active_key", "concurrency_key", EXCLUSIVE_SQL, unique=True),
        # The reaper's scan follows the number of running rows, not the journal.
        _partial(f"ix_{name}_running_heartbeat", "heartbeat_at", "state = 'running'"),
        Index(f"ix_{name}_state_updated", "state", "updated_at"),
        # The jobs list by task (a LIKE prefix, whatever the collation) and the charts'
        # claims of a window (migration 0023).
        Index(
            f"ix_{name}_task_state_updated",
            "task_name",
            "state",
            "updated_at",
            postgresql_ops={"task_name": "varchar_pattern_ops"},
        ),
        _partial(f"ix_{name}_attempted", "attempted_at", "attempted_at IS NOT NULL"),
        # Retention and reconcile ask for finished rows only; NULLs cost every
        # enqueue and claim an index entry (migration 0008).
        _partial(f"ix_{name}_finished", "finished_at", "finished_at IS NOT NULL"),
        # The scheduled page: queued runs not due yet, soonest first (migration 0029).
        _partial(f"ix_{name}_scheduled", "next_retry_at", SCHEDULED_SQL),
        # The reaper's expiry pass: queued runs with an expiry, soonest first (migration
        # 0030); a run without one (most) takes no entry.
        _partial(f"ix_{name}_expiring", "expires_at", EXPIRING_SQL),
        # Retention deletes a workflow's runs whole (migration 0022); a job of its own
        # takes no entry.
        _partial(f"ix_{name}_workflow", "workflow_id", "workflow_id IS NOT NULL"),
    )


def _partial(name: str, column: str, where: str, *, unique: bool = False) -> Index:
    """An index of the rows ``where`` holds for, on both dialects."""
    return Index(
        name, column, unique=unique, postgresql_where=text(where), sqlite_where=text(where)
    )


class JobRun(RunMixin, Base):
    """Runs of tasks that declare no domain table; their arguments live in ``params``."""

    __tablename__ = "job_runs"

    params: Mapped[dict[str, Any]] = mapped_column(JSON)


class KeySlot(Base):
    """A run of a limited key (``limit=N``, ``fair``): holding slot ``slot_no`` (< N) or,
    with none, waiting for one in ``id`` order; the row goes when the run stops holding.

    The unique (run_table, concurrency_key, slot_no) is the limit itself: N distinct slot
    numbers exist, so no transaction, on any host, can make an N+1st holder.
    """

    __tablename__ = "key_slots"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_table: Mapped[str] = mapped_column(String(64))
    concurrency_key: Mapped[str] = mapped_column(String(200))
    job_id: Mapped[uuid.UUID]
    key_limit: Mapped[int] = mapped_column(Integer)
    slot_no: Mapped[int | None] = mapped_column(Integer)
    # When the run was to start had it not waited (a countdown); NULL: at once.
    due_at: Mapped[datetime | None]
    created_at: Mapped[datetime]

    __table_args__ = (
        UniqueConstraint("run_table", "job_id", name="uq_key_slots_job"),
        UniqueConstraint("run_table", "concurrency_key", "slot_no", name="uq_key_slots_slot"),
        CheckConstraint(
            "slot_no IS NULL OR (slot_no >= 0 AND slot_no < key_limit)",
            name="ck_key_slots_slot_no",
        ),
        # The waiters of a key, oldest first.
        Index(
            "ix_key_slots_waiting",
            "run_table",
            "concurrency_key",
            "id",
            postgresql_where=text("slot_no IS NULL"),
            sqlite_where=text("slot_no IS NULL"),
        ),
    )


class OutboxMessage(Base):
    """A broker message written in the transaction of the state change that needs it."""

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    module: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[uuid.UUID]
    attempt: Mapped[int] = mapped_column(Integer)
    task_name: Mapped[str] = mapped_column(String(200))
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime]
    available_at: Mapped[datetime]
    published_at: Mapped[datetime | None]
    publish_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    delivered_at: Mapped[datetime | None]
    # Publishes that failed through the row's own fault (a body that no longer validates);
    # a broker that is down counts against no row. Each one backs the row off.
    publish_failures: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    last_error: Mapped[str | None] = mapped_column(Text)
    # The relay gave up on the row; only an operator's retry brings it back.
    dead_at: Mapped[datetime | None]
    # The run's queue when the row was written (NULL: the app's default queue).
    queue: Mapped[str | None] = mapped_column(String(200))
    # The run's priority (0 when it has none, where both brokers put a message without
    # one): the relay publishes due rows in the order the broker serves them.
    priority: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))

    __table_args__ = (
        UniqueConstraint("module", "job_id", "attempt", name="uq_outbox_attempt"),
        CheckConstraint("attempt >= 1", name="ck_outbox_attempt"),
        Index(
            "ix_outbox_pending",
            "available_at",
            postgresql_where=text(OUTBOX_PENDING_SQL),
            sqlite_where=text(OUTBOX_PENDING_SQL),
        ),
        # available_at of a published row is when the relay next checks it was claimed.
        Index(
            "ix_outbox_inflight",
            "available_at",
            postgresql_where=text(OUTBOX_INFLIGHT_SQL),
            sqlite_where=text(OUTBOX_INFLIGHT_SQL),
        ),
        Index(
            "ix_outbox_delivered",
            "delivered_at",
            postgresql_where=text("delivered_at IS NOT NULL"),
            sqlite_where=text("delivered_at IS NOT NULL"),
        ),
        Index(
            "ix_outbox_dead",
            "dead_at",
            postgresql_where=text("dead_at IS NOT NULL"),
            sqlite_where=text("dead_at IS NOT NULL"),
        ),
    )


# The relay's due rows by level (migration 0019): domain, queue ('' for the app's default)
# and priority lead, so the relay skips a paused queue's or domain's backlog with one probe
# per level and reads each open level's rows by due time, then as written
# (outbox_queries.due_messages).
# PostgreSQL only: SQLite's relay walks the due rows (and SQLite's reflection, hence
# alembic's batch rebuilds, would lose an index on an expression).
Index(
    "ix_outbox_pending_level",
    OutboxMessage.module,
    func.coalesce(OutboxMessage.queue, literal_column("''")),
    OutboxMessage.priority,
    OutboxMessage.available_at,
    OutboxMessage.id,
    postgresql_where=text(OUTBOX_PENDING_SQL),
).ddl_if(dialect="postgresql")


class WorkflowStep(Base):
    """One step of a canvas (docs/workflows.md): what to run once what it waits for is done.

    Written with the canvas's first runs; a step's run row is inserted, under the step's
    ``job_id``, in the transaction that records the success (or the failure, for an
    errback) it waits for (journal/workflow.py).
    """

    __tablename__ = "workflow_steps"

    job_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    workflow_id: Mapped[uuid.UUID]
    # Where the step sits in the canvas ("0.1", "2.body", "0.err0"): its job id derives
    # from the workflow id and this, so the same canvas written twice is the same steps.
    path: Mapped[str] = mapped_column(String(200))
    module: Mapped[str] = mapped_column(String(64))
    task_name: Mapped[str] = mapped_column(String(200))
    # The signature's own (partial) arguments; unless immutable, what it waits for comes first.
    args: Mapped[list[Any]] = mapped_column(JSON)
    kwargs: Mapped[dict[str, Any]] = mapped_column(JSON)
    immutable: Mapped[bool] = mapped_column(Boolean)
    max_attempts: Mapped[int] = mapped_column(Integer)
    queue: Mapped[str | None] = mapped_column(String(200))
    priority: Mapped[int | None] = mapped_column(Integer)
    # "start" (written at once), "success" of what ``after`` names, or "failure" (an errback).
    trigger: Mapped[str] = mapped_column(String(16))
    # The job id it waits for, or a (nested) list of them: a group's results in order.
    after: Mapped[Any | None] = mapped_column(JSON(none_as_null=True))
    # The steps this step's success (``next``) and its failure (``errbacks``) may start.
    next: Mapped[list[str]] = mapped_column(JSON)
    errbacks: Mapped[list[str]] = mapped_column(JSON)
    # A step waiting for several (a chord's body): how many of them have not succeeded yet,
    # counted down under the step's lock by each success, so only the one that reaches
    # zero reads the members' results (null: one parent, or written before migration 0020).
    members_left: Mapped[int | None] = mapped_column(Integer)
    # What the step's body sees as its ``root_id``, ``parent_id`` and ``group``, as far as
    # the canvas says (migration 0031): a step started by a success takes its parent, and a
    # root left out, from the step that started it (null: written before 0031).
    lineage: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # Seconds the step's run waits after the transaction that starts it (Celery's
    # ``sig.set(countdown=...)`` on a step; migration 0032); null: none.
    countdown: Mapped[float | None] = mapped_column(Float)
    # The name its run's messages show (Celery's ``sig.set(shadow=...)`` on a step, or its
    # task's ``shadow_name``; migration 0033); null: the task's own.
    shadow: Mapped[str | None] = mapped_column(Text)
    # Set when what the step waits for failed for good: it will not run (``upstream_failed``,
    # or ``chord_failed`` for a chord's body), unless a replay of that step succeeds.
    blocked_at: Mapped[datetime | None]
    blocked_outcome: Mapped[str | None] = mapped_column(String(32))
    blocked_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]

    __table_args__ = (
        Index("ix_workflow_steps_workflow", "workflow_id"),
        # Retention's workflow cut reads the steps written before its cutoff (migration 0027).
        Index("ix_workflow_steps_created", "created_at"),
        CheckConstraint(
            "trigger IN ('start', 'success', 'failure')", name="ck_workflow_steps_trigger"
        ),
    )


class MaintenanceCounter(Base):
    """Running totals the maintenance passes keep (repairs), read by ``/metrics``.

    Kept in the database because beat does the work while a web process answers the scrape.
    """

    __tablename__ = "maintenance_counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


class MetricTotal(Base):
    """/metrics counters and histogram buckets by module and task; see ``monitor.rollup``."""

    __tablename__ = "metric_totals"

    metric: Mapped[str] = mapped_column(String(32), primary_key=True)
    module: Mapped[str] = mapped_column(String(64), primary_key=True)
    task: Mapped[str] = mapped_column(String(200), primary_key=True)
    # An outcome, a histogram bucket's upper bound, or the histogram's sum in milliseconds.
    label: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


class ChartMinute(Base):
    """The charts' series: per minute, module and task, the attempts by outcome, the
    enqueues and the wait and duration histograms' bucket counts (migration 0028); kept by
    the rollup with ``metric_totals``, read by /admin/charts, dropped by age."""

    __tablename__ = "chart_minutes"

    minute: Mapped[datetime] = mapped_column(primary_key=True)
    metric: Mapped[str] = mapped_column(String(32), primary_key=True)
    module: Mapped[str] = mapped_column(String(64), primary_key=True)
    task: Mapped[str] = mapped_column(String(200), primary_key=True)
    label: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


class RunCount(Base):
    """Finished runs a run table holds, by task, queue, state and outcome (migration 0026).

    The rollup adds each run that entered a terminal state; retention, a replay and a rerun
    take a counted run off in their own transaction (journal/finished_counts.py). ``''``
    stands for no queue (the app's default) and no outcome.
    """

    __tablename__ = "run_counts"

    module: Mapped[str] = mapped_column(String(64), primary_key=True)
    task: Mapped[str] = mapped_column(String(200), primary_key=True)
    queue: Mapped[str] = mapped_column(String(200), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), primary_key=True)
    outcome: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


class WorkflowCount(Base):
    """Finished workflows by state (``succeeded``, ``failed``), kept with ``run_counts``
    (migration 0026, journal/finished_counts.py)."""

    __tablename__ = "workflow_counts"

    state: Mapped[str] = mapped_column(String(16), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


class Lease(Base):
    """A named singleton lease (beat's leadership); a holder renews it before it expires."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    acquired_at: Mapped[datetime]
    renewed_at: Mapped[datetime]
    expires_at: Mapped[datetime]


class JobEvent(Base):
    """Append-only history: one row per transition, written in the transition's transaction."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    module: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[uuid.UUID]
    attempt: Mapped[int] = mapped_column(Integer)
    transition: Mapped[str] = mapped_column(String(32))
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str | None] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str | None] = mapped_column(Text)
    # A failed attempt's exception type, scrubbed message and scrubbed traceback (bounded).
    # None is SQL NULL (no failure), not the JSON literal null.
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    at: Mapped[datetime]

    __table_args__ = (
        Index("ix_job_events_job", "module", "job_id"),
        Index("ix_job_events_at", "at"),
        # The charts pair an ending with its claim (migration 0023).
        Index(
            "ix_job_events_claims",
            "module",
            "job_id",
            "attempt",
            postgresql_where=text("transition = 'claim'"),
            sqlite_where=text("transition = 'claim'"),
        ),
    )


class WorkerProcess(Base):
    """A Celery worker process as its own beat reports it (``monitor.workers``).

    Run rows name the process that holds them; this names the processes, idle ones too,
    and the queues each consumes, so the console can say a queue has no consumer.
    """

    __tablename__ = "workers"

    # ``<nodename>:<pid>``; a run's ``worker`` column starts with the node name.
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    nodename: Mapped[str] = mapped_column(String(200))
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    pool: Mapped[str] = mapped_column(String(64))
    concurrency: Mapped[int] = mapped_column(Integer)
    queues: Mapped[list[str]] = mapped_column(JSON)
    started_at: Mapped[datetime]
    beat_at: Mapped[datetime]
    # Set by a clean shutdown; a killed process just stops beating.
    stopped_at: Mapped[datetime | None]

    __table_args__ = (Index("ix_workers_beat_at", "beat_at"),)
