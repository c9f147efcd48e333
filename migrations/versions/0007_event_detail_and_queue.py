"""Failure detail on job events; the producer's queue on run and outbox rows

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 13:00:00.000000

``job_events.detail`` keeps a failed attempt's exception type, scrubbed message and
scrubbed traceback beside the one-line ``reason``. ``queue`` on every run table and on the
outbox remembers where the producer sent the job, so the relay and the reaper publish its
later messages to the same queue. A run table created by 0005 on a fresh database already
has the column (``ddl.create_run_table`` carries the contract as it is now).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.lifecycle.journal.ddl import queue_column

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUN_TABLES = ("job_runs", "attachment_runs", "reprocess_runs")


def _has_queue(table: str) -> bool:
    columns = sa.inspect(op.get_bind()).get_columns(table)
    return any(c["name"] == "queue" for c in columns)


def upgrade() -> None:
    with op.batch_alter_table("job_events") as batch:
        batch.add_column(sa.Column("detail", sa.JSON(), nullable=True))
    for table in (*RUN_TABLES, "outbox"):
        if not _has_queue(table):
            with op.batch_alter_table(table) as batch:
                batch.add_column(queue_column())


def downgrade() -> None:
    for table in (*RUN_TABLES, "outbox"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("queue")
    with op.batch_alter_table("job_events") as batch:
        batch.drop_column("detail")
