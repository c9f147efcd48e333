"""Canvas workflows: every run row may be a step of one, and the steps wait in a table

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 18:40:00.000000

``workflow_steps`` holds a canvas (chain, group, chord, link, link_error) as steps: each
names the task, its partial arguments and options, and what it waits for; a step's run is
inserted in the transaction that records the success (or failure) it waits for
(docs/workflows.md). ``workflow_id`` on every run table ties a run to its workflow; the
finish statement returns it, so an ordinary job's finish looks for no successor. A run
table created by 0001, 0002 or 0005 on a fresh database already has the column
(``ddl.create_run_table``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.db import UtcDateTime
from jobsapp.lifecycle.journal.ddl import RUNS_VIEW, replace_runs_view, workflow_column

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out: the run tables and the runs view as they were on the day of this migration.
RUNS = (("jobs", "job_runs"), ("attachments", "attachment_runs"), ("reprocess", "reprocess_runs"))
RUN_TABLES = tuple(table for _, table in RUNS)


def _missing(table: str) -> bool:
    columns = sa.inspect(op.get_bind()).get_columns(table)
    return not any(c["name"] == "workflow_id" for c in columns)


def upgrade() -> None:
    for table in RUN_TABLES:
        if _missing(table):
            with op.batch_alter_table(table) as batch:
                batch.add_column(workflow_column())
    op.create_table(
        "workflow_steps",
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("workflow_id", sa.Uuid(), nullable=False),
        sa.Column("path", sa.String(length=200), nullable=False),
        sa.Column("module", sa.String(length=64), nullable=False),
        sa.Column("task_name", sa.String(length=200), nullable=False),
        sa.Column("args", sa.JSON(), nullable=False),
        sa.Column("kwargs", sa.JSON(), nullable=False),
        sa.Column("immutable", sa.Boolean(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("queue", sa.String(length=200), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=True),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("after", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("next", sa.JSON(), nullable=False),
        sa.Column("errbacks", sa.JSON(), nullable=False),
        sa.Column("blocked_at", UtcDateTime(timezone=True), nullable=True),
        sa.Column("blocked_outcome", sa.String(length=32), nullable=True),
        sa.Column("blocked_reason", sa.Text(), nullable=True),
        sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "trigger IN ('start', 'success', 'failure')", name="ck_workflow_steps_trigger"
        ),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_index("ix_workflow_steps_workflow", "workflow_steps", ["workflow_id"])


def downgrade() -> None:
    op.drop_index("ix_workflow_steps_workflow", table_name="workflow_steps")
    op.drop_table("workflow_steps")
    # SQLite drops a column by rebuilding the table, which a view over it forbids.
    op.execute(f"DROP VIEW IF EXISTS {RUNS_VIEW}")
    for table in RUN_TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("workflow_id")
    replace_runs_view(RUNS)
