"""Up to N active runs per concurrency key: ``key_limit`` on every run row, ``key_slots``

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01 19:00:00.000000

A task declared with ``limit=N`` (N >= 2) or ``fair=True`` writes ``key_limit`` on its
runs; they leave the one-active-run-per-key index (its predicate gains
``AND key_limit IS NULL``, so every other run keeps it exactly) and share their key through
``key_slots`` instead: a row per active run, holding a slot number below N (unique per
key) or waiting for one (docs/flow-control.md). A run table created by 0001, 0002 or 0005
on a fresh database already has the column, its check and the narrowed index
(``ddl.create_run_table``).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.db import UtcDateTime
from jobsapp.lifecycle.journal.ddl import (
    RUNS_VIEW,
    create_active_key_index,
    key_limit_column,
    replace_runs_view,
)

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out: the run tables and the runs view as they were on the day of this migration.
RUNS = (("jobs", "job_runs"), ("attachments", "attachment_runs"), ("reprocess", "reprocess_runs"))
RUN_TABLES = tuple(table for _, table in RUNS)
ACTIVE = "state IN ('queued', 'running')"
EXCLUSIVE = f"{ACTIVE} AND key_limit IS NULL"


def _missing(table: str) -> bool:
    columns = sa.inspect(op.get_bind()).get_columns(table)
    return not any(c["name"] == "key_limit" for c in columns)


def _key_slots() -> None:
    op.create_table(
        "key_slots",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_table", sa.String(length=64), nullable=False),
        sa.Column("concurrency_key", sa.String(length=200), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("key_limit", sa.Integer(), nullable=False),
        sa.Column("slot_no", sa.Integer(), nullable=True),
        sa.Column("due_at", UtcDateTime(timezone=True), nullable=True),
        sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_table", "job_id", name="uq_key_slots_job"),
        sa.UniqueConstraint("run_table", "concurrency_key", "slot_no", name="uq_key_slots_slot"),
        sa.CheckConstraint(
            "slot_no IS NULL OR (slot_no >= 0 AND slot_no < key_limit)", name="ck_key_slots_slot_no"
        ),
    )
    waiting = sa.text("slot_no IS NULL")
    op.create_index(
        "ix_key_slots_waiting",
        "key_slots",
        ["run_table", "concurrency_key", "id"],
        postgresql_where=waiting,
        sqlite_where=waiting,
    )


def upgrade() -> None:
    missing = [table for table in RUN_TABLES if _missing(table)]
    if missing:
        # SQLite rebuilds a table to add a check, which a view over it forbids.
        op.execute(f"DROP VIEW IF EXISTS {RUNS_VIEW}")
    for table in missing:
        with op.batch_alter_table(table) as batch:
            batch.add_column(key_limit_column())
            batch.create_check_constraint(
                f"ck_{table}_key_limit", "key_limit IS NULL OR key_limit >= 1"
            )
            batch.drop_index(f"uq_{table}_active_key")
        with op.batch_alter_table(table) as batch:
            create_active_key_index(batch, table, EXCLUSIVE)
    if missing:
        replace_runs_view(RUNS)
    _key_slots()


def downgrade() -> None:
    op.drop_index("ix_key_slots_waiting", table_name="key_slots")
    op.drop_table("key_slots")
    # SQLite drops a column by rebuilding the table, which a view over it forbids.
    op.execute(f"DROP VIEW IF EXISTS {RUNS_VIEW}")
    for table in RUN_TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_index(f"uq_{table}_active_key")
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(f"ck_{table}_key_limit", type_="check")
            batch.drop_column("key_limit")
            create_active_key_index(batch, table, ACTIVE)
    replace_runs_view(RUNS)
