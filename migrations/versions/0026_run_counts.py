"""run_counts, workflow_counts: the finished runs and workflows, kept by the rollup

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-04 14:30:00.000000

The admin overview, ``/metrics/cluster`` and ``jobsapp summary`` counted runs by state with
a GROUP BY over every run table on each request. Finished runs are now counted once, by
beat's metrics rollup after a ``finished_at`` cursor per run table (a
``maintenance_counters`` row), and a finished workflow with its last finished run;
retention, a replay and a rerun take a counted one off in their own transaction
(jobsapp/lifecycle/journal/finished_counts.py). The table starts
empty with no cursor: the first rollup passes count the finished runs already kept.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_counts",
        sa.Column("module", sa.String(length=64), nullable=False),
        sa.Column("task", sa.String(length=200), nullable=False),
        sa.Column("queue", sa.String(length=200), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("value", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("module", "task", "queue", "state", "outcome"),
    )
    op.create_table(
        "workflow_counts",
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("value", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("state"),
    )


def downgrade() -> None:
    op.drop_table("workflow_counts")
    op.drop_table("run_counts")
    # The cursors go too: counted again from the start if the table comes back.
    op.execute("DELETE FROM maintenance_counters WHERE name LIKE 'run_counts_cursor:%'")
