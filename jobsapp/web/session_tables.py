"""The console's server-side session state (migration 0021): the login sessions, which a
logout or their lifetime ends whatever cookie a browser still holds, and the server's own
random secret that signs the session cookie (never derived from the admin token alone)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String, Text
from sqlalchemy.orm import Mapped, mapped_column

from jobsapp.lifecycle.journal.tables import Base


class WebSession(Base):
    """One login: its cookie names it by a random id, kept here only as its SHA-256."""

    __tablename__ = "web_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    actor: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime]
    seen_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    # An HMAC of the admin token the session was opened with: another token ends it.
    token_mark: Mapped[str | None] = mapped_column(String(64))


class WebSecret(Base):
    """A secret the web processes share, made once by the first that needs it."""

    __tablename__ = "web_secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]


class WebThrottle(Base):
    """Failed token checks of one scope (a client address, or everyone) within a window."""

    __tablename__ = "web_throttle"

    scope: Mapped[str] = mapped_column(String(100), primary_key=True)
    failures: Mapped[int]
    last_at: Mapped[datetime]
    blocked_until: Mapped[datetime]
