"""lifecycle contract: run tables, outbox, leases, job events

Revision ID: 0001
Revises:
Create Date: 2026-11-30 03:28:01.641019
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import jobsapp.db
from jobsapp.lifecycle.journal.ddl import create_run_table

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("module", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("transition", sa.String(length=32), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=True),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("at", jobsapp.db.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.create_index("ix_job_events_at", ["at"], unique=False)
        batch_op.create_index("ix_job_events_job", ["module", "job_id"], unique=False)

    create_run_table("job_runs", sa.Column("params", sa.JSON(), nullable=False))

    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("acquired_at", jobsapp.db.UtcDateTime(timezone=True), nullable=False),
        sa.Column("renewed_at", jobsapp.db.UtcDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", jobsapp.db.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "outbox",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("module", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("task_name", sa.String(length=200), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("created_at", jobsapp.db.UtcDateTime(timezone=True), nullable=False),
        sa.Column("available_at", jobsapp.db.UtcDateTime(timezone=True), nullable=False),
        sa.Column("published_at", jobsapp.db.UtcDateTime(timezone=True), nullable=True),
        sa.Column("publish_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("delivered_at", jobsapp.db.UtcDateTime(timezone=True), nullable=True),
        sa.CheckConstraint("attempt >= 1", name="ck_outbox_attempt"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("module", "job_id", "attempt", name="uq_outbox_attempt"),
    )
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.create_index("ix_outbox_delivered", ["delivered_at"], unique=False)
        batch_op.create_index(
            "ix_outbox_inflight",
            ["available_at"],
            unique=False,
            postgresql_where=sa.text("published_at IS NOT NULL AND delivered_at IS NULL"),
            sqlite_where=sa.text("published_at IS NOT NULL AND delivered_at IS NULL"),
        )
        batch_op.create_index(
            "ix_outbox_pending",
            ["available_at"],
            unique=False,
            postgresql_where=sa.text("published_at IS NULL"),
            sqlite_where=sa.text("published_at IS NULL"),
        )


def downgrade() -> None:
    for table in ("outbox", "leases", "job_runs", "job_events"):
        op.drop_table(table)
