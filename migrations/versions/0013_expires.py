"""Every run row may carry an expiry and a pending cancel request

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-01 17:00:00.000000

``expires_at`` is Celery's ``expires`` (``apply_async(expires=...)``): an attempt still
queued past it never runs and the job fails with outcome ``expired``. ``cancel_requested_at``
is a revoke (``app.control.revoke``) or an operator's cancel of a running attempt, kept in
the journal so a worker restart does not forget it: the attempt's heartbeat stops the body
and its success is refused. A run table created by 0001, 0002 or 0005 on a fresh database
already has both (``ddl.create_run_table``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.lifecycle.journal.ddl import RUNS_VIEW, expiry_and_cancel_columns, replace_runs_view

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out: the run tables and the runs view as they were on the day of this migration.
RUNS = (("jobs", "job_runs"), ("attachments", "attachment_runs"), ("reprocess", "reprocess_runs"))
RUN_TABLES = tuple(table for _, table in RUNS)
NAMES = ("expires_at", "cancel_requested_at")


def _missing(table: str) -> bool:
    columns = sa.inspect(op.get_bind()).get_columns(table)
    return not any(c["name"] == "expires_at" for c in columns)


def upgrade() -> None:
    for table in RUN_TABLES:
        if _missing(table):
            with op.batch_alter_table(table) as batch:
                for column in expiry_and_cancel_columns():
                    batch.add_column(column)


def downgrade() -> None:
    # SQLite drops a column by rebuilding the table, which a view over it forbids.
    op.execute(f"DROP VIEW IF EXISTS {RUNS_VIEW}")
    for table in RUN_TABLES:
        with op.batch_alter_table(table) as batch:
            for name in NAMES:
                batch.drop_column(name)
    replace_runs_view(RUNS)
