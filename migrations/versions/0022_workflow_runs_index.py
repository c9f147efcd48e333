"""Runs of a workflow are found by their workflow

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04 09:00:00.000000

Retention deletes a workflow whole (its runs in every run table and its steps, in one
transaction) once none of its runs is active and its last activity has aged out; it asks
each run table for the workflow's runs. Partial: a job of its own (no workflow) takes no
entry, so the hot path of a plain job pays nothing for it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.lifecycle.journal.ddl import build_index

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUN_TABLES = ("job_runs", "attachment_runs", "reprocess_runs")
WHERE = sa.text("workflow_id IS NOT NULL")


def upgrade() -> None:
    # A run table created since (ddl.create_run_table) has it already.
    for table in RUN_TABLES:
        build_index(f"ix_{table}_workflow", table, ["workflow_id"], where=WHERE)


def downgrade() -> None:
    for table in RUN_TABLES:
        op.drop_index(f"ix_{table}_workflow", table_name=table)
