"""attachments: the upload record, its run table and its published variants

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 03:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.db import UtcDateTime
from jobsapp.lifecycle.journal.ddl import create_run_table

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from the models: a migration must keep creating what
# it created on the day it was written.
KEY = sa.String(length=1024)


def _timestamp(name: str) -> sa.Column[object]:
    return sa.Column(name, UtcDateTime(timezone=True), nullable=False)


def _attachments() -> None:
    op.create_table(
        "attachments",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("content_type", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("height", sa.Integer(), nullable=False),
        sa.Column("display_name", sa.String(length=255), nullable=False),
        sa.Column("staging_key", KEY, nullable=False),
        sa.Column("original_key", KEY, nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("published_version", sa.Integer(), nullable=True),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.CheckConstraint(
            "state IN ('queued', 'processing', 'ready', 'failed')", name="ck_attachments_state"
        ),
        sa.CheckConstraint(
            "state <> 'ready' OR (published_version IS NOT NULL AND original_key IS NOT NULL)",
            name="ck_attachments_ready_published",
        ),
        sa.CheckConstraint(
            "size > 0 AND width > 0 AND height > 0", name="ck_attachments_dimensions"
        ),
        sa.CheckConstraint(
            "published_version IS NULL OR published_version >= 1",
            name="ck_attachments_published_version",
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("idempotency_key", name="uq_attachments_idempotency_key"),
    )
    with op.batch_alter_table("attachments") as batch:
        batch.create_index("ix_attachments_state_updated", ["state", "updated_at"])


def _attachment_runs() -> None:
    create_run_table(
        "attachment_runs",
        sa.Column("attachment_id", sa.Uuid(), nullable=False),
        sa.Column("pipeline_version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["attachment_id"], ["attachments.id"], name="fk_attachment_runs_attachment"
        ),
    )
    with op.batch_alter_table("attachment_runs") as batch:
        batch.create_index("ix_attachment_runs_attachment_id", ["attachment_id"])


def _attachment_variants() -> None:
    op.create_table(
        "attachment_variants",
        sa.Column("attachment_id", sa.Uuid(), nullable=False),
        sa.Column("pipeline_version", sa.Integer(), nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("object_key", KEY, nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("height", sa.Integer(), nullable=False),
        sa.Column("content_type", sa.String(length=64), nullable=False),
        _timestamp("created_at"),
        sa.CheckConstraint("pipeline_version >= 1", name="ck_attachment_variants_version"),
        sa.ForeignKeyConstraint(
            ["attachment_id"], ["attachments.id"], name="fk_attachment_variants_attachment"
        ),
        # The effect key: one row per published variant, whatever is redelivered.
        sa.PrimaryKeyConstraint("attachment_id", "pipeline_version", "variant"),
    )


def upgrade() -> None:
    _attachments()
    _attachment_runs()
    _attachment_variants()


def downgrade() -> None:
    for table in ("attachment_variants", "attachment_runs", "attachments"):
        op.drop_table(table)
