"""A chord's body counts down its members' successes instead of reading them all at each

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02 01:10:00.000000

``workflow_steps.members_left``: for a step that waits for several (a chord's body), how
many have not succeeded yet. Each member's success decrements it under the body's row
lock, and only the success that brings it to zero reads the members' results: a chord of
N members costs O(N) rows, not every member reading all the others (O(N^2)). Steps
written before this migration have none, and keep reading the members at each success.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workflow_steps") as batch:
        batch.add_column(sa.Column("members_left", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workflow_steps") as batch:
        batch.drop_column("members_left")
