"""ix_workflow_steps_created: retention finds aged workflows through an index

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-04 15:20:00.000000

Retention's workflow cut looks for steps written before its cutoff; with no index on
``workflow_steps.created_at`` it read the whole table on every pass (472 ms a batch at
10^7 runs in ``python -m bench growth``). Only a workflow's steps pay for the index.
"""

from collections.abc import Sequence

from alembic import op

from jobsapp.lifecycle.journal.ddl import build_index

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    build_index("ix_workflow_steps_created", "workflow_steps", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_workflow_steps_created", table_name="workflow_steps")
