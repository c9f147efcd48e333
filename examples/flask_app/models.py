"""The example's own table, in the database jobsapp uses (``JOBSAPP_DATABASE_URL``)."""

from __future__ import annotations

from sqlalchemy import LargeBinary, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Upload(Base):
    """An uploaded file; ``measure`` fills in its size and digest."""

    __tablename__ = "example_uploads"

    id: Mapped[int] = mapped_column(primary_key=True)
    filename: Mapped[str] = mapped_column(String(255))
    content: Mapped[bytes] = mapped_column(LargeBinary)
    size: Mapped[int | None]
    sha256: Mapped[str | None] = mapped_column(String(64))
