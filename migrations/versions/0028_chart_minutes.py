"""chart_minutes: the charts' series, kept per minute by the rollup

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-04 18:30:00.000000

/admin/charts grouped the window's events into buckets on each request: the rows it read
grew with the journal (ratio 22.8 for the day from 10^5 to 10^6 runs in ``python -m bench
growth``). The rollup now adds what it counts to a row per minute, metric, module, task and
label, and the page reads the window's minutes through the primary key. The table starts
empty: minutes before the upgrade show nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.db import UtcDateTime

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "chart_minutes",
        sa.Column("minute", UtcDateTime(timezone=True), nullable=False),
        sa.Column("metric", sa.String(length=32), nullable=False),
        sa.Column("module", sa.String(length=64), nullable=False),
        sa.Column("task", sa.String(length=200), nullable=False),
        sa.Column("label", sa.String(length=32), nullable=False),
        sa.Column("value", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("minute", "metric", "module", "task", "label"),
    )


def downgrade() -> None:
    op.drop_table("chart_minutes")
