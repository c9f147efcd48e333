"""The relay reads due outbox rows by level (domain, queue, priority), skipping paused ones

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-01 22:00:00.000000

``ix_outbox_pending_level`` (module, coalesce(queue, ''), priority, available_at, id)
over the pending rows replaces ``ix_outbox_pending_priority``: the relay finds the levels
that hold pending rows with one probe each, leaves out those of a paused queue or domain
without reading their rows, and takes each open level's rows by due time (then as
written), in whichever priority order the broker serves (ascending on Redis, descending
on RabbitMQ). PostgreSQL only: SQLite's relay walks the due rows (it has no LATERAL), and
an index on an expression would not survive SQLite's batch table rebuilds (alembic cannot
reflect it).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.lifecycle.journal.ddl import build_index

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PENDING = sa.text("published_at IS NULL AND dead_at IS NULL")


def _postgres() -> bool:
    return bool(op.get_bind().dialect.name == "postgresql")


def upgrade() -> None:
    op.drop_index("ix_outbox_pending_priority", "outbox")
    if _postgres():
        build_index(
            "ix_outbox_pending_level",
            "outbox",
            ["module", sa.text("coalesce(queue, '')"), "priority", "available_at", "id"],
            where=PENDING,
        )


def downgrade() -> None:
    if _postgres():
        op.drop_index("ix_outbox_pending_level", "outbox")
    op.create_index(
        "ix_outbox_pending_priority",
        "outbox",
        [sa.text("priority DESC"), "available_at"],
        postgresql_where=PENDING,
        sqlite_where=PENDING,
    )
