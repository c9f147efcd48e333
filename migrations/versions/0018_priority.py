"""Every run and outbox row carries the job's priority; the relay publishes by it

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01 19:00:00.000000

``priority`` is Celery's ``priority`` option of the job (``apply_async(priority=...)``, a
task's ``priority``; NULL: none given). The run row keeps it so every later message of the
job (a retry, a reap, a rerun, a republish) carries it too; the outbox row copies it
(0 for none: the lowest, as both brokers take a message without one) and
``ix_outbox_pending_priority`` serves the relay's order, most urgent first and then by due
time. A run table created by 0001, 0002 or 0005 on a fresh database already has the
column (``ddl.create_run_table``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.lifecycle.journal.ddl import (
    RUNS_VIEW,
    outbox_priority_column,
    priority_column,
    replace_runs_view,
)

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out: the run tables and the runs view as they were on the day of this migration.
RUNS = (("jobs", "job_runs"), ("attachments", "attachment_runs"), ("reprocess", "reprocess_runs"))
RUN_TABLES = tuple(table for _, table in RUNS)
PENDING = sa.text("published_at IS NULL AND dead_at IS NULL")


def _missing(table: str) -> bool:
    columns = sa.inspect(op.get_bind()).get_columns(table)
    return not any(c["name"] == "priority" for c in columns)


def upgrade() -> None:
    for table in RUN_TABLES:
        if _missing(table):
            with op.batch_alter_table(table) as batch:
                batch.add_column(priority_column())
    with op.batch_alter_table("outbox") as batch:
        batch.add_column(outbox_priority_column())
    op.create_index(
        "ix_outbox_pending_priority",
        "outbox",
        [sa.text("priority DESC"), "available_at"],
        postgresql_where=PENDING,
        sqlite_where=PENDING,
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_pending_priority", "outbox")
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("priority")
    # SQLite drops a column by rebuilding the table, which a view over it forbids.
    op.execute(f"DROP VIEW IF EXISTS {RUNS_VIEW}")
    for table in RUN_TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("priority")
    replace_runs_view(RUNS)
