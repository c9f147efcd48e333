"""Every run row keeps what its body returned

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 17:00:00.000000

``result`` is written by the succeed statement, in the same guarded UPDATE that records
the success (docs/lifecycle.md, "Results"); ``handle.get()`` and ``AsyncResult(id).get()``
read it. Runs finished before this migration keep NULL. A run table created by 0001, 0002
or 0005 on a fresh database already has the column (``ddl.create_run_table``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.lifecycle.journal.ddl import RUNS_VIEW, replace_runs_view, result_column

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out: the run tables and the runs view as they were on the day of this migration.
RUNS = (("jobs", "job_runs"), ("attachments", "attachment_runs"), ("reprocess", "reprocess_runs"))
RUN_TABLES = tuple(table for _, table in RUNS)


def _has_result(table: str) -> bool:
    columns = sa.inspect(op.get_bind()).get_columns(table)
    return any(c["name"] == "result" for c in columns)


def upgrade() -> None:
    for table in RUN_TABLES:
        if not _has_result(table):
            with op.batch_alter_table(table) as batch:
                batch.add_column(result_column())


def downgrade() -> None:
    # SQLite drops a column by rebuilding the table, which a view over it forbids.
    op.execute(f"DROP VIEW IF EXISTS {RUNS_VIEW}")
    for table in RUN_TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("result")
    replace_runs_view(RUNS)
