"""workers: the Celery worker processes as each one's own beat reports them

Revision ID: 0011
Revises: 0008
Create Date: 2026-12-01 12:00:00.000000

The console's workers page and the jobs list's "no worker consumes this queue" read it;
a worker writes its row every few seconds from a thread of its main process.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.db import UtcDateTime

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("nodename", sa.String(length=200), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("pool", sa.String(length=64), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("queues", sa.JSON(), nullable=False),
        sa.Column("started_at", UtcDateTime(timezone=True), nullable=False),
        sa.Column("beat_at", UtcDateTime(timezone=True), nullable=False),
        sa.Column("stopped_at", UtcDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_index("ix_workers_beat_at", "workers", ["beat_at"])


def downgrade() -> None:
    op.drop_index("ix_workers_beat_at", table_name="workers")
    op.drop_table("workers")
