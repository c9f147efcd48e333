"""workflow_steps.shadow: the name a canvas step's messages show

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-07 17:00:00.000000

Celery's ``sig.set(shadow=...)`` on a canvas step (``chain(a.s(), b.s().set(shadow="x"))``)
names the step's task in logs, events and Flower; jobsapp refused the option on a step.
``shadow`` keeps it with the step, and the run the step starts as keeps it with its call
(``params.shadow``), so every attempt's message carries it. Null: the task's own name.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workflow_steps") as batch:
        batch.add_column(sa.Column("shadow", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workflow_steps") as batch:
        batch.drop_column("shadow")
