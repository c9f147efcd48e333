"""workflow_steps.countdown: a canvas step delayed after what it waits for

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-06 11:45:00.000000

Celery's ``sig.set(countdown=N)`` on a canvas step (``chain(a.s(), b.s().set(countdown=5))``)
sends it N seconds after what it waits for ended; jobsapp refused the option on a step.
``countdown`` keeps it with the step, and the run the step starts as is due that long after
the transaction that starts it (journal/workflow.py). Null: no delay of its own.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workflow_steps") as batch:
        batch.add_column(sa.Column("countdown", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workflow_steps") as batch:
        batch.drop_column("countdown")
