"""The console's server-side session state (migration 0021): the login sessions, which a
logout or their lifetime ends whatever cookie a browser still holds, and the server's own
random secret that signs the session cookie (never derived from the admin token alone)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String, Text
from sqlalchemy.orm import Mapped, mapped_column

from jobsapp.lifecycle.tables import Base


class WebSession(Base):
    """One login: its cookie names it by a random id, kept here only as its SHA-256."""

    __tablename__ = "web_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    actor: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime]
    seen_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]


class WebSecret(Base):
    """A secret the web processes share, made once by the first that needs it."""

    __tablename__ = "web_secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
