"""The finished and delivered indexes hold only rows that have the timestamp

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30 15:00:00.000000

``ix_<run table>_finished`` and ``ix_outbox_delivered`` serve retention and reconcile
(``finished_at < cutoff``, ``delivered_at < cutoff``), which never look for NULL; indexed
in full, every enqueue and claim also inserted a NULL entry into each (three index
insertions and their WAL records per job on the hot path). Partial, they take an entry
only when a run finishes or a message is marked delivered.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUN_TABLES = ("job_runs", "attachment_runs", "reprocess_runs")


def _indexes() -> list[tuple[str, str, str]]:
    """(table, index, column) of every index this migration rebuilds."""
    runs = [(t, f"ix_{t}_finished", "finished_at") for t in RUN_TABLES]
    return [*runs, ("outbox", "ix_outbox_delivered", "delivered_at")]


def _rebuild(partial: bool) -> None:
    for table, index, column in _indexes():
        where = sa.text(f"{column} IS NOT NULL") if partial else None
        op.drop_index(index, table_name=table)
        op.create_index(index, table, [column], postgresql_where=where, sqlite_where=where)


def upgrade() -> None:
    _rebuild(partial=True)


def downgrade() -> None:
    _rebuild(partial=False)
