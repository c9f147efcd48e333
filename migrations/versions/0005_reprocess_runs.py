"""reprocess_runs: the re-processing backfill as a lifecycle job; the runs view over it

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 13:00:00.000000

A backfill to a pipeline version keeps its cursor and step statistics in its run row;
its key (the target version) lets one backfill per version be active. ``job_runs_all``
is regenerated with the new table.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.lifecycle.journal.ddl import create_run_table, replace_runs_view

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than read from the registry: a migration keeps creating what it
# created on the day it was written.
BEFORE = (("jobs", "job_runs"), ("attachments", "attachment_runs"))
AFTER = (*BEFORE, ("reprocess", "reprocess_runs"))


def _counter(name: str) -> sa.Column[int]:
    return sa.Column(name, sa.Integer(), server_default=sa.text("0"), nullable=False)


def upgrade() -> None:
    create_run_table(
        "reprocess_runs",
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("target_version", sa.Integer(), nullable=False),
        sa.Column("cursor", sa.Uuid(), nullable=True),
        *(_counter(name) for name in ("scanned", "enqueued", "skipped", "failed")),
    )
    replace_runs_view(AFTER)


def downgrade() -> None:
    replace_runs_view(BEFORE)
    op.drop_table("reprocess_runs")
