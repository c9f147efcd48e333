"""Migration operations for a run table, shared by every domain's Alembic migration.

Changing this module changes what future migrations create, never past databases: a
change to the contract needs a migration of its own for the existing run tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import sqlalchemy as sa
from alembic import op

from jobsapp.db import UtcDateTime
from jobsapp.lifecycle.journal.tables import run_table_indexes

# How long a migration's DDL waits for its table's lock (PostgreSQL's lock_timeout, set by
# migrations/env.py). ALTER TABLE waits for every transaction open on the table, and every
# query of the table that comes after it waits behind it: a long transaction (a pg_dump,
# an idle psql session) would stop the journal for as long as it lasts. Past this, the
# migration stops instead, and ``jobsapp db upgrade`` says so in one line.
MIGRATION_LOCK_TIMEOUT_S = 10


# Set on a connection's ``info`` by migrations/env.py: the connection was handed to Alembic
# inside a transaction of the caller's, which Alembic cannot step out of.
CALLERS_TRANSACTION = "jobsapp.migrations.callers_transaction"


def lock_timeout_statement() -> str:
    return f"SET LOCAL lock_timeout = '{MIGRATION_LOCK_TIMEOUT_S}s'"


def _columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("task_name", sa.String(length=200), nullable=False),
        sa.Column("concurrency_key", sa.String(length=200), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("rescues", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("heartbeat_at", UtcDateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("next_retry_at", UtcDateTime(timezone=True), nullable=True),
        sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
        sa.Column("started_at", UtcDateTime(timezone=True), nullable=True),
        sa.Column("finished_at", UtcDateTime(timezone=True), nullable=True),
        sa.Column("updated_at", UtcDateTime(timezone=True), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=True),
        queue_column(),
        claim_token_column(),
        result_column(),
        *expiry_and_cancel_columns(),
        workflow_column(),
        key_limit_column(),
        *row_fact_columns(),
        priority_column(),
        *time_limit_columns(),
    ]


def queue_column() -> sa.Column[Any]:
    """Added to the contract by migration 0007."""
    return sa.Column("queue", sa.String(length=200), nullable=True)


def claim_token_column() -> sa.Column[Any]:
    """Added to the contract by migration 0009."""
    return sa.Column("claim_token", sa.Uuid(), nullable=True)


def result_column() -> sa.Column[Any]:
    """Added to the contract by migration 0012."""
    return sa.Column("result", sa.JSON(none_as_null=True), nullable=True)


def expiry_and_cancel_columns() -> list[sa.Column[Any]]:
    """Added to the contract by migration 0013."""
    return [
        sa.Column("expires_at", UtcDateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested_at", UtcDateTime(timezone=True), nullable=True),
    ]


def workflow_column() -> sa.Column[Any]:
    """Added to the contract by migration 0014."""
    return sa.Column("workflow_id", sa.Uuid(), nullable=True)


def key_limit_column() -> sa.Column[Any]:
    """Added to the contract by migration 0016."""
    return sa.Column("key_limit", sa.Integer(), nullable=True)


def key_limit_check(name: str) -> sa.CheckConstraint:
    """Added to the contract by migration 0016."""
    return sa.CheckConstraint("key_limit IS NULL OR key_limit >= 1", name=f"ck_{name}_key_limit")


def create_active_key_index(batch: Any, name: str, where: str) -> None:
    """The one-active-run-per-key index; since 0016 ``where`` leaves limited runs out."""
    batch.create_index(
        f"uq_{name}_active_key",
        ["concurrency_key"],
        unique=True,
        postgresql_where=sa.text(where),
        sqlite_where=sa.text(where),
    )


def row_fact_columns() -> list[sa.Column[Any]]:
    """Added to the contract by migration 0015."""
    return [
        sa.Column("enqueued_by", sa.String(length=200), nullable=True),
        sa.Column("attempted_at", UtcDateTime(timezone=True), nullable=True),
    ]


def priority_column() -> sa.Column[Any]:
    """Added to the contract by migration 0018 (NULL: no priority given)."""
    return sa.Column("priority", sa.SmallInteger(), nullable=True)


def time_limit_columns() -> list[sa.Column[Any]]:
    """Added to the contract by migration 0025 (NULL: the task's own limits apply)."""
    return [
        sa.Column("time_limit", sa.Float(), nullable=True),
        sa.Column("soft_time_limit", sa.Float(), nullable=True),
    ]


def outbox_priority_column() -> sa.Column[Any]:
    """The outbox's copy, by migration 0018: 0 (the lowest) when none was given."""
    return sa.Column("priority", sa.SmallInteger(), server_default=sa.text("0"), nullable=False)


def _checks(name: str) -> list[sa.CheckConstraint]:
    return [
        sa.CheckConstraint(
            "state IN ('queued', 'running', 'succeeded', 'failed')", name=f"ck_{name}_state"
        ),
        sa.CheckConstraint(
            "state NOT IN ('succeeded', 'failed') OR finished_at IS NOT NULL",
            name=f"ck_{name}_terminal_finished",
        ),
        sa.CheckConstraint(
            "state <> 'running' OR heartbeat_at IS NOT NULL", name=f"ck_{name}_running_heartbeat"
        ),
        sa.CheckConstraint(
            "attempts >= 0 AND max_attempts >= 1 AND rescues >= 0", name=f"ck_{name}_counters"
        ),
        key_limit_check(name),
    ]


def create_run_table(name: str, *extra: Any) -> None:
    """Create a run table with the lifecycle contract plus the domain's ``extra`` items: its
    columns, checks and every index of the contract as it is today (``run_table_indexes``);
    a later migration that adds an index to the run tables of its day skips one that has it."""
    op.create_table(name, *extra, *_columns(), *_checks(name), sa.PrimaryKeyConstraint("job_id"))
    for index in run_table_indexes(name):
        columns = [str(column) for column in index.expressions]
        op.create_index(index.name, name, columns, unique=index.unique, **index.dialect_kwargs)


# The UNION ALL projection over every run table, for ad-hoc SQL and dashboards.
RUNS_VIEW = "job_runs_all"
RUNS_VIEW_COLUMNS = (
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


def runs_view_sql(run_tables: Sequence[tuple[str, str]]) -> str:
    """``CREATE VIEW`` over ``(module, table)`` pairs; the CAST gives the module literal
    one declared type on both dialects."""
    branches = "\nUNION ALL\n".join(
        f"SELECT CAST('{module}' AS VARCHAR(64)) AS module, {', '.join(RUNS_VIEW_COLUMNS)} "  # noqa: S608 - names of the migration's own
        f"FROM {table}"
        for module, table in run_tables
    )
    return f"CREATE VIEW {RUNS_VIEW} AS\n{branches}"


def replace_runs_view(run_tables: Sequence[tuple[str, str]]) -> None:
    """A migration that adds a run table regenerates the view with it (spell the pairs out
    in the migration: it must keep creating what it created that day)."""
    op.execute(f"DROP VIEW IF EXISTS {RUNS_VIEW}")
    op.execute(runs_view_sql(run_tables))


def build_index(
    name: str, table: str, columns: Sequence[Any], *, where: Any = None, **options: Any
) -> None:
    """An index added to a table that is in use, as a migration must add it.

    On PostgreSQL ``CREATE INDEX CONCURRENTLY``, outside the migration's transaction: a
    plain ``CREATE INDEX`` holds a SHARE lock for its whole build, and every claim, finish
    and enqueue on the table waits behind it (seconds to minutes on a journal of 10^7
    runs, during a deploy's ``jobsapp db upgrade``). An index an interrupted build left
    invalid is dropped first (``IF NOT EXISTS`` would keep it, unused for ever). Elsewhere
    (SQLite, or a connection handed to Alembic inside its caller's transaction) a plain
    ``CREATE INDEX``. Already there (a table created since), nothing.
    """
    bind = op.get_bind()
    create = partial(
        op.create_index,
        name,
        table,
        columns,
        if_not_exists=True,
        postgresql_where=where,
        sqlite_where=where,
        **options,
    )
    if bind.dialect.name != "postgresql" or bind.info.get(CALLERS_TRANSACTION):
        create()  # in a caller's transaction (a test's, a fresh database's): transactional
        return
    # Outside the transaction, so without the migration's lock_timeout (SET LOCAL): a
    # concurrent build's waits for old transactions hold no one back.
    with op.get_context().autocommit_block():
        invalid = bind.execute(
            sa.text(
                "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE c.relname = :name AND NOT i.indisvalid"
            ),
            {"name": name},
        ).first()
        if invalid is not None:
            op.execute(sa.text(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"'))
        create(postgresql_concurrently=True)
    op.execute(sa.text(lock_timeout_statement()))  # for the migration's next transaction
