"""Every run row carries its happy path: who enqueued it, when its attempt was claimed

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 19:00:00.000000

``enqueued_by`` and ``attempted_at`` let a successful job journal its enqueue, claim and
success on the run row alone (journal/row_events.py): the timeline, the metrics rollup
and the charts read those three events from the row. Rows written before this migration
keep NULL in both, and their event rows stay the record of what happened to them. A run
table created by 0001, 0002 or 0005 on a fresh database already has both
(``ddl.create_run_table``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.lifecycle.journal.ddl import RUNS_VIEW, replace_runs_view, row_fact_columns

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out: the run tables and the runs view as they were on the day of this migration.
RUNS = (("jobs", "job_runs"), ("attachments", "attachment_runs"), ("reprocess", "reprocess_runs"))
RUN_TABLES = tuple(table for _, table in RUNS)
NAMES = ("enqueued_by", "attempted_at")


def _missing(table: str) -> bool:
    columns = sa.inspect(op.get_bind()).get_columns(table)
    return not any(c["name"] == "attempted_at" for c in columns)


def upgrade() -> None:
    for table in RUN_TABLES:
        if _missing(table):
            with op.batch_alter_table(table) as batch:
                for column in row_fact_columns():
                    batch.add_column(column)


def downgrade() -> None:
    # SQLite drops a column by rebuilding the table, which a view over it forbids.
    op.execute(f"DROP VIEW IF EXISTS {RUNS_VIEW}")
    for table in RUN_TABLES:
        with op.batch_alter_table(table) as batch:
            for name in NAMES:
                batch.drop_column(name)
    replace_runs_view(RUNS)
