"""job_runs_all: one UNION ALL projection over the run tables

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 05:10:00.000000

For ad-hoc SQL and dashboards; the admin summary reads each run table in its own home
(docs/domains.md) and does not depend on this view. A migration that adds a run table must
replace the view with that table included. On SQLite a batch migration that rebuilds a
run table must drop the view first and create it again after: SQLite refuses to rename
the rebuilt table while a view names the dropped one.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VIEW = "job_runs_all"
# Spelled out rather than read from the registry: a migration must keep creating what it
# created on the day it was written.
RUN_TABLES = (("jobs", "job_runs"), ("attachments", "attachment_runs"))
COLUMNS = (
    "job_id",
    "task_name",
    "concurrency_key",
    "state",
    "outcome",
    "attempts",
    "max_attempts",
    "heartbeat_at",
    "last_error",
    "next_retry_at",
    "created_at",
    "updated_at",
    "finished_at",
    "worker",
)


def _branch(module: str, table: str) -> str:
    # The CAST gives the literal one declared type on both dialects. S608: every part is a
    # constant of this file.
    return f"SELECT CAST('{module}' AS VARCHAR(64)) AS module, {', '.join(COLUMNS)} FROM {table}"  # noqa: S608


def upgrade() -> None:
    branches = "\nUNION ALL\n".join(_branch(module, table) for module, table in RUN_TABLES)
    op.execute(f"CREATE VIEW {VIEW} AS\n{branches}")


def downgrade() -> None:
    op.execute(f"DROP VIEW IF EXISTS {VIEW}")
