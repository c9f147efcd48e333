"""Every run row carries the token of the claim that holds it

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 16:00:00.000000

``claim_token`` is written by each claim (a fresh UUID) and checked by every write of the
running attempt: heartbeat, finish, fail, requeue and the domains' writes under the fence.
``attempts`` alone could not tell two claims of the same attempt apart, and there are two
when a PostgreSQL crash loses a claim committed without waiting for the flush and the
relay's republish is claimed again (docs/lifecycle.md, "The claim fence"). Rows claimed
before this migration keep NULL until their next claim. A run table created by 0001, 0002
or 0005 on a fresh database already has the column (``ddl.create_run_table``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.lifecycle.journal.ddl import RUNS_VIEW, claim_token_column, replace_runs_view

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out: the run tables and the runs view as they were on the day of this migration.
RUNS = (("jobs", "job_runs"), ("attachments", "attachment_runs"), ("reprocess", "reprocess_runs"))
RUN_TABLES = tuple(table for _, table in RUNS)


def _has_token(table: str) -> bool:
    columns = sa.inspect(op.get_bind()).get_columns(table)
    return any(c["name"] == "claim_token" for c in columns)


def upgrade() -> None:
    for table in RUN_TABLES:
        if not _has_token(table):
            with op.batch_alter_table(table) as batch:
                batch.add_column(claim_token_column())


def downgrade() -> None:
    # SQLite drops a column by rebuilding the table, which a view over it forbids.
    op.execute(f"DROP VIEW IF EXISTS {RUNS_VIEW}")
    for table in RUN_TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("claim_token")
    replace_runs_view(RUNS)
