"""Every run carries the time limits its call asked for

``time_limit`` and ``soft_time_limit`` are Celery's options of one call
(``apply_async(time_limit=..., soft_time_limit=...)``; NULL: the task's own limits). The run
row keeps them so every message of the job (a retry's, a republish's) carries them in its
``timelimit`` header, which the prefork pool enforces, as it does for a plain Celery call.
NULL columns take no space on the rows of calls without them.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04 11:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.lifecycle.journal.ddl import RUNS_VIEW, replace_runs_view, time_limit_columns

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out: the run tables and the runs view as they were on the day of this migration.
RUNS = (("jobs", "job_runs"), ("attachments", "attachment_runs"), ("reprocess", "reprocess_runs"))
RUN_TABLES = tuple(table for _, table in RUNS)


def _missing(table: str) -> bool:
    columns = sa.inspect(op.get_bind()).get_columns(table)
    return not any(c["name"] == "time_limit" for c in columns)


def upgrade() -> None:
    for table in RUN_TABLES:
        if _missing(table):
            with op.batch_alter_table(table) as batch:
                for column in time_limit_columns():
                    batch.add_column(column)


def downgrade() -> None:
    # SQLite drops a column by rebuilding the table, which a view over it forbids.
    op.execute(f"DROP VIEW IF EXISTS {RUNS_VIEW}")
    for table in RUN_TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("soft_time_limit")
            batch.drop_column("time_limit")
    replace_runs_view(RUNS)
