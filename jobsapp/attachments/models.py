"""The attachment tables: the client-visible record, its runs and its published variants.

``attachments`` is what a client polls; ``attachment_runs`` is the lifecycle journal of
processing (one run per attachment and pipeline version); ``attachment_variants`` holds
one row per effect key ``(attachment_id, pipeline_version, variant)``, so a redelivered
or re-run job can never publish a variant twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Connection,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    UniqueConstraint,
    select,
    text,
    update,
)
from sqlalchemy.orm import Mapped, mapped_column

from jobsapp.db import utcnow
from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.journal.registry import ReconcilePolicy, RunTable, StalePolicy
from jobsapp.lifecycle.journal.tables import Base, RunMixin
from jobsapp.lifecycle.rules.states import ACTIVE_STATES, Transition

# S3's key limit; the object store enforces the same on both backends.
KEY_LENGTH = 1024


class AttachmentState(StrEnum):
    """What a client sees (docs/domains.md); ``ready`` is never left for ``processing``."""

    QUEUED = "queued"
    PROCESSING = "processing"
    READY = "ready"
    FAILED = "failed"


_STATES = ", ".join(f"'{s.value}'" for s in AttachmentState)


class Attachment(Base):
    """An accepted upload: trusted metadata the worker reads instead of the message."""

    __tablename__ = "attachments"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    # Sniffed from the magic bytes; the client's declared type is never stored.
    content_type: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    width: Mapped[int] = mapped_column(Integer)
    height: Mapped[int] = mapped_column(Integer)
    # For display only: sanitised, and never part of a storage key.
    display_name: Mapped[str] = mapped_column(String(255))
    staging_key: Mapped[str] = mapped_column(String(KEY_LENGTH))
    original_key: Mapped[str | None] = mapped_column(String(KEY_LENGTH))
    state: Mapped[str] = mapped_column(String(16))
    published_version: Mapped[int | None] = mapped_column(Integer)
    error_code: Mapped[str | None] = mapped_column(String(64))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]

    __table_args__ = (
        CheckConstraint(f"state IN ({_STATES})", name="ck_attachments_state"),
        # "ready only when published" is kept by the database, not only by the worker.
        CheckConstraint(
            "state <> 'ready' OR (published_version IS NOT NULL AND original_key IS NOT NULL)",
            name="ck_attachments_ready_published",
        ),
        CheckConstraint("size > 0 AND width > 0 AND height > 0", name="ck_attachments_dimensions"),
        CheckConstraint(
            "published_version IS NULL OR published_version >= 1",
            name="ck_attachments_published_version",
        ),
        UniqueConstraint("idempotency_key", name="uq_attachments_idempotency_key"),
        # Retention scans failed attachments by age.
        Index("ix_attachments_state_updated", "state", "updated_at"),
    )


class AttachmentRun(RunMixin, Base):
    """One processing job of an attachment at a pipeline version (the lifecycle contract)."""

    __tablename__ = "attachment_runs"

    attachment_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("attachments.id", name="fk_attachment_runs_attachment"), index=True
    )
    pipeline_version: Mapped[int] = mapped_column(Integer)


class ReprocessRun(RunMixin, Base):
    """One backfill to a pipeline version (``jobsapp reprocess``), a lifecycle job of its own.

    Its key is the target version, so one backfill per version is active. The cursor and
    the step statistics move in the transaction of each batch's enqueues: a pass that dies
    leaves them exactly where its last committed batch left them, and the next attempt
    resumes from there.
    """

    __tablename__ = "reprocess_runs"

    # The body's arguments (target version, batch size, pause); they never travel.
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    target_version: Mapped[int] = mapped_column(Integer)
    # The last attachment id a committed batch handled (keyset order).
    cursor: Mapped[uuid.UUID | None]
    scanned: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    enqueued: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # Already queued or running at the target version, or their key held by another job.
    skipped: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # Left out: their job at the target version failed before.
    failed: Mapped[int] = mapped_column(Integer, server_default=text("0"))


class AttachmentVariant(Base):
    """A published variant; the primary key is the effect key."""

    __tablename__ = "attachment_variants"

    attachment_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("attachments.id", name="fk_attachment_variants_attachment"),
        primary_key=True,
    )
    pipeline_version: Mapped[int] = mapped_column(Integer, primary_key=True)
    variant: Mapped[str] = mapped_column(String(64), primary_key=True)
    object_key: Mapped[str] = mapped_column(String(KEY_LENGTH))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    width: Mapped[int] = mapped_column(Integer)
    height: Mapped[int] = mapped_column(Integer)
    content_type: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime]

    __table_args__ = (
        CheckConstraint("pipeline_version >= 1", name="ck_attachment_variants_version"),
    )


# Core handles for the conditional statements (SQLAlchemy types ``__table__`` loosely).
ATTACHMENTS: Table = Attachment.__table__  # type: ignore[assignment]
RUNS: Table = AttachmentRun.__table__  # type: ignore[assignment]
VARIANTS: Table = AttachmentVariant.__table__  # type: ignore[assignment]
REPROCESS: Table = ReprocessRun.__table__  # type: ignore[assignment]

# How a run moved by the reaper or an operator moves its attachment: (from, to, error_code).
# ``ready`` is in no "from": a re-processing run never takes a published attachment back.
_MIRROR: dict[Transition, tuple[tuple[AttachmentState, ...], AttachmentState, str | None]] = {
    Transition.REAP_REQUEUE: ((AttachmentState.PROCESSING,), AttachmentState.QUEUED, None),
    Transition.REAP_FAIL: (
        (AttachmentState.QUEUED, AttachmentState.PROCESSING),
        AttachmentState.FAILED,
        "stale",
    ),
    Transition.CANCEL: (
        (AttachmentState.QUEUED, AttachmentState.PROCESSING),
        AttachmentState.FAILED,
        "cancelled",
    ),
    Transition.EXPIRE: ((AttachmentState.QUEUED,), AttachmentState.FAILED, "expired"),
    Transition.REPLAY: ((AttachmentState.FAILED,), AttachmentState.QUEUED, None),
    Transition.RERUN: ((AttachmentState.FAILED,), AttachmentState.QUEUED, None),
}


def mirror_run_change(
    conn: Connection, transition: Transition, runs: Sequence[Mapping[str, Any]]
) -> None:
    """Keep the client-visible state in step with runs moved outside the task body."""
    if transition not in _MIRROR:
        return
    sources, target, error_code = _MIRROR[transition]
    # Another version's run still at work owns the attachment's state.
    other_active = (
        select(RUNS.c.job_id)
        .where(
            RUNS.c.attachment_id == ATTACHMENTS.c.id,
            RUNS.c.state.in_(ACTIVE_STATES),
            RUNS.c.job_id.not_in([r["job_id"] for r in runs]),
        )
        .exists()
    )
    conn.execute(
        update(ATTACHMENTS)
        .where(
            ATTACHMENTS.c.id.in_([r["attachment_id"] for r in runs]),
            ATTACHMENTS.c.state.in_([s.value for s in sources]),
            ~other_active,
        )
        .values(state=target.value, error_code=error_code, updated_at=utcnow())
    )


# What an outage or a deploy broke is worth another try; what the bytes themselves are
# (another try renders the same failure) or what an operator must look at is not.
RETAKEN_CODES = frozenset(
    {"storage_unavailable", "storage_error", "database_error", "internal_error", "unknown_pipeline"}
)
NEVER_RETAKEN_CODES = frozenset(
    {
        "corrupt_image",
        "pixel_limit",
        "unsupported_format",
        "staging_checksum",
        "staging_missing",
        "attachment_missing",
    }
)

ATTACHMENT_RUNS = registry.register(
    RunTable(
        module="attachments",
        table=RUNS,
        # A dead worker's job is worth another attempt: every effect is idempotent.
        stale_policy=StalePolicy.REQUEUE,
        id_columns=("attachment_id", "pipeline_version"),
        on_change=mirror_run_change,
        reconcile=ReconcilePolicy(retake=RETAKEN_CODES, never=NEVER_RETAKEN_CODES),
    )
)


REPROCESS_RUNS = registry.register(
    RunTable(
        module="reprocess",
        table=REPROCESS,
        # A killed backfill resumes from its cursor: requeueing it repeats no batch.
        stale_policy=StalePolicy.REQUEUE,
        params_column="params",
        # A pass that exhausted its attempts in an outage resumes from its cursor.
        reconcile=ReconcilePolicy(
            retake=frozenset({"TransientError", "OperationalError", "database_error"}),
            cool_down=timedelta(minutes=15),
        ),
    )
)
