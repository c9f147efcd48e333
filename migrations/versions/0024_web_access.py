"""Guessing made expensive, sessions tied to the token they were opened with

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04 11:45:00.000000

``web_throttle`` counts failed token checks (login form, bearer) per client address and
for everyone, in the database so that every gunicorn worker process sees the same counts:
after 5 failures an address waits twice as long after each next one (``web/throttle.py``).
``web_sessions.token_mark`` names the admin token a session was opened with (an HMAC of
it): a session whose mark is not the current token's ends on the server, so a rotated
token ends every session even when it is rotated back. Sessions opened before this
revision have no mark and end.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.db import UtcDateTime

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "web_throttle",
        sa.Column("scope", sa.String(length=100), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_at", UtcDateTime(timezone=True), nullable=False),
        sa.Column("blocked_until", UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope"),
    )
    with op.batch_alter_table("web_sessions") as batch:
        batch.add_column(sa.Column("token_mark", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("web_sessions") as batch:
        batch.drop_column("token_mark")
    op.drop_table("web_throttle")
