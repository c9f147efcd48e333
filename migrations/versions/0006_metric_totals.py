"""metric_totals: counters and histogram buckets of /metrics, rolled up by beat

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 12:40:00.000000

Beat rolls ``job_events`` up into these rows (its cursor is a ``maintenance_counters``
row), so a worker's hot path writes nothing for metrics and a scrape reads a few rows.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "metric_totals",
        sa.Column("metric", sa.String(length=32), nullable=False),
        sa.Column("module", sa.String(length=64), nullable=False),
        sa.Column("task", sa.String(length=200), nullable=False),
        sa.Column("label", sa.String(length=32), nullable=False),
        sa.Column("value", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("metric", "module", "task", "label"),
    )


def downgrade() -> None:
    op.drop_table("metric_totals")
