"""outbox: publish failures, backoff and dead rows; maintenance counters

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 12:00:00.000000

A row whose publish keeps failing through its own fault backs off and ends ``dead``
instead of blocking every newer due row; the relay's working sets (the partial indexes)
leave dead rows out. ``maintenance_counters`` keeps the relay's repair count for /metrics.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import jobsapp.db

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported: a migration keeps creating what it created that day.
PENDING_BEFORE = "published_at IS NULL"
INFLIGHT_BEFORE = "published_at IS NOT NULL AND delivered_at IS NULL"
PENDING = "published_at IS NULL AND dead_at IS NULL"
INFLIGHT = "published_at IS NOT NULL AND delivered_at IS NULL AND dead_at IS NULL"


def _working_sets(batch_op: object, pending: str, inflight: str) -> None:
    for name, where in (("ix_outbox_pending", pending), ("ix_outbox_inflight", inflight)):
        batch_op.create_index(  # type: ignore[attr-defined]
            name,
            ["available_at"],
            unique=False,
            postgresql_where=sa.text(where),
            sqlite_where=sa.text(where),
        )


def upgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("publish_failures", sa.Integer(), server_default=sa.text("0"), nullable=False)
        )
        batch_op.add_column(sa.Column("last_error", sa.Text(), nullable=True))
        batch_op.add_column(
            sa.Column("dead_at", jobsapp.db.UtcDateTime(timezone=True), nullable=True)
        )
        batch_op.drop_index("ix_outbox_pending")
        batch_op.drop_index("ix_outbox_inflight")
        _working_sets(batch_op, PENDING, INFLIGHT)
        batch_op.create_index(
            "ix_outbox_dead",
            ["dead_at"],
            unique=False,
            postgresql_where=sa.text("dead_at IS NOT NULL"),
            sqlite_where=sa.text("dead_at IS NOT NULL"),
        )
    op.create_table(
        "maintenance_counters",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("maintenance_counters")
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_index("ix_outbox_dead")
        batch_op.drop_index("ix_outbox_pending")
        batch_op.drop_index("ix_outbox_inflight")
        _working_sets(batch_op, PENDING_BEFORE, INFLIGHT_BEFORE)
        batch_op.drop_column("dead_at")
        batch_op.drop_column("last_error")
        batch_op.drop_column("publish_failures")
