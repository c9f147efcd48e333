"""flow control: paused queues and domains, their audit trail, and global rate state

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01 19:00:00.000000

``flow_pauses`` holds one row per paused queue or domain (the relay publishes nothing for
it, workers claim nothing from it). ``flow_actions`` is the audit trail of pauses and
resumes (no job to hang a ``job_events`` row on). ``flow_rates`` keeps, per rate-limited
task and rate key, the earliest time the next run may start (GCRA's theoretical arrival
time, in epoch seconds on the database's clock): one guarded upsert per claim; and how far
runs handed back to wait for it have reserved starts (``reserved_at``), so that a backlog
is published one start after another rather than all at each start.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.db import UtcDateTime

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "flow_pauses",
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("paused_at", UtcDateTime(timezone=True), nullable=False),
        sa.Column("paused_by", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.CheckConstraint("kind IN ('queue', 'domain')", name="ck_flow_pauses_kind"),
        sa.PrimaryKeyConstraint("kind", "name"),
    )
    op.create_table(
        "flow_actions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("at", UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "flow_rates",
        sa.Column("task_name", sa.String(length=200), nullable=False),
        sa.Column("rate_key", sa.String(length=200), nullable=False),
        sa.Column("next_at", sa.Float(), nullable=False),
        sa.Column("reserved_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("task_name", "rate_key"),
    )


def downgrade() -> None:
    op.drop_table("flow_rates")
    op.drop_table("flow_actions")
    op.drop_table("flow_pauses")
