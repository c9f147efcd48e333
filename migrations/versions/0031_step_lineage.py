"""workflow_steps.lineage: the ids a canvas step's body sees as its root, parent and group

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-06 10:45:00.000000

Celery gives a canvas's task the ids that tie it to the canvas (``self.request.root_id``,
``parent_id``, ``group``): a chain's later steps root at its first task with the step
before as parent, a group's members and a chord's body carry the group's id. The canvas
compiler knows them when it writes the steps, but for the parent of a step started by a
success (the step whose success started it, a chord's last member) and a root inherited
from that one: ``lineage`` keeps what is known, and the run row of each step keeps what
its body sees (journal/workflow.py). Steps written before this migration have none, and
their bodies see what the message carries, as before.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workflow_steps") as batch:
        batch.add_column(sa.Column("lineage", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workflow_steps") as batch:
        batch.drop_column("lineage")
