"""The task filter and the charts' claims are read through indexes

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04 12:00:00.000000

- ``ix_<table>_task_state_updated`` (each run table): the jobs list filtered by task (a
  prefix, ``LIKE 'billing.%'``) reads the task's rows of one state, newest first, instead of
  the whole table. ``varchar_pattern_ops`` on Postgres: a prefix ``LIKE`` is an index range
  whatever the database's collation.
- ``ix_<table>_attempted`` (each run table, partial): the charts' queue waits read the
  window's claims the run rows carry (``attempted_at >= start``) newest first; a run never
  claimed takes no entry.
- ``ix_job_events_claims`` (partial): the charts' run durations pair each ending of their
  sample with its claim event by ``(module, job_id, attempt)``; only claim events (an
  attempt that did not succeed on its row) take an entry.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.lifecycle.journal.ddl import build_index

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUN_TABLES = ("job_runs", "attachment_runs", "reprocess_runs")
ATTEMPTED = sa.text("attempted_at IS NOT NULL")
CLAIMS = sa.text("transition = 'claim'")


def upgrade() -> None:
    # A run table created since (ddl.create_run_table) has it already.
    for table in RUN_TABLES:
        build_index(
            f"ix_{table}_task_state_updated",
            table,
            ["task_name", "state", "updated_at"],
            postgresql_ops={"task_name": "varchar_pattern_ops"},
        )
        build_index(f"ix_{table}_attempted", table, ["attempted_at"], where=ATTEMPTED)
    build_index("ix_job_events_claims", "job_events", ["module", "job_id", "attempt"], where=CLAIMS)


def downgrade() -> None:
    op.drop_index("ix_job_events_claims", table_name="job_events")
    for table in RUN_TABLES:
        op.drop_index(f"ix_{table}_attempted", table_name=table)
        op.drop_index(f"ix_{table}_task_state_updated", table_name=table)
