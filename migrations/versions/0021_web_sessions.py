"""The console's sessions live on the server: a logout and their lifetime end them

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04 06:10:00.000000

``web_sessions`` holds one row per login (the SHA-256 of the random id its cookie carries,
who logged in, when, when last seen, when ended): every console request checks it, so a
logout ends the session at once, 8 hours after the login it ends whatever the browser does,
and an idle session ends too. ``web_secrets`` holds the random secret, made by the first web
process that needs it, that signs the cookie together with the admin token, so a visitor's
cookie is no oracle to test token guesses against (unless ``JOBSAPP_SECRET_KEY`` is set).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobsapp.db import UtcDateTime

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
        sa.Column("seen_at", UtcDateTime(timezone=True), nullable=False),
        sa.Column("ended_at", UtcDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id_hash"),
    )
    op.create_table(
        "web_secrets",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("created_at", UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("web_secrets")
    op.drop_table("web_sessions")
