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
    CheckConstraint,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column

from jobsapp.db import UtcDateTime
from jobsapp.lifecycle.states import ACTIVE_STATES, ALL_STATES, TERMINAL_STATES

# SQLite only autoincrements an INTEGER PRIMARY KEY (the rowid alias).
BigId = BigInteger().with_variant(Integer(), "sqlite")


def _in_list(states: tuple[str, ...]) -> str:
    return ", ".join(f"'{s}'" for s in states)


ACTIVE_SQL = f"state IN ({_in_list(ACTIVE_STATES)})"
# The relay's two working sets of outbox rows; a dead row is in neither.
OUTBOX_PENDING_SQL = "published_at IS NULL AND dead_at IS NULL"
OUTBOX_INFLIGHT_SQL = "published_at IS NOT NULL AND delivered_at IS NULL AND dead_at IS NULL"


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UtcDateTime, dict[str, Any]: JSON}


class RunMixin:
    """The columns and guards every run table shares (DESIGN.md section 2)."""

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
    # attempt's heartbeat stops the body, and its success is refused (journal/revoke.py).
    cancel_requested_at: Mapped[datetime | None]
    # Celery's ``priority`` of the job (NULL: none given): every message of the job carries
    # it, a retry's and a republish's too (docs/flow-control.md, "Priorities").
    priority: Mapped[int | None] = mapped_column(SmallInteger)

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
            # The mutual exclusion of the contract: one active run per key.
            Index(
                f"uq_{name}_active_key",
                "concurrency_key",
                unique=True,
                postgresql_where=text(ACTIVE_SQL),
                sqlite_where=text(ACTIVE_SQL),
            ),
            # The reaper's scan follows the number of running rows, not the journal.
            Index(
                f"ix_{name}_running_heartbeat",
                "heartbeat_at",
                postgresql_where=text("state = 'running'"),
                sqlite_where=text("state = 'running'"),
            ),
            Index(f"ix_{name}_state_updated", "state", "updated_at"),
            # Retention and reconcile ask for finished rows only; NULLs cost every
            # enqueue and claim an index entry (migration 0008).
            Index(
                f"ix_{name}_finished",
                "finished_at",
                postgresql_where=text("finished_at IS NOT NULL"),
                sqlite_where=text("finished_at IS NOT NULL"),
            ),
        )


class JobRun(RunMixin, Base):
    """Runs of tasks that declare no domain table; their arguments live in ``params``."""

    __tablename__ = "job_runs"

    params: Mapped[dict[str, Any]] = mapped_column(JSON)


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
    # The run's priority (0, the lowest, when it has none): the relay publishes the most
    # urgent due rows first.
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


# The relay's order (migration 0018), the most urgent first; ix_outbox_pending serves the
# backlog's age.
Index(
    "ix_outbox_pending_priority",
    OutboxMessage.priority.desc(),
    OutboxMessage.available_at,
    postgresql_where=text(OUTBOX_PENDING_SQL),
    sqlite_where=text(OUTBOX_PENDING_SQL),
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
