"""Flow control's tables (migration 0017): paused queues and domains, their audit trail,
and the state of global rate limits. Only ``journal/flow_rows.py`` writes them."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, Float, String, Table, Text
from sqlalchemy.orm import Mapped, mapped_column

from jobsapp.lifecycle.journal.tables import Base, BigId


class FlowPause(Base):
    """A paused queue or domain: the relay publishes nothing for it, workers claim nothing."""

    __tablename__ = "flow_pauses"

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    paused_at: Mapped[datetime]
    paused_by: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (CheckConstraint("kind IN ('queue', 'domain')", name="ck_flow_pauses_kind"),)


class FlowAction(Base):
    """The audit row of a pause or a resume (there is no job to give a ``job_events`` row)."""

    __tablename__ = "flow_actions"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    action: Mapped[str] = mapped_column(String(16))
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(200))
    actor: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime]


class FlowRate(Base):
    """Per rate-limited task and rate key: the earliest start of its next run (GCRA's
    theoretical arrival time), epoch seconds on the database's clock."""

    __tablename__ = "flow_rates"

    task_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    rate_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    next_at: Mapped[float] = mapped_column(Float)
    # The start after the last one reserved by a run handed back to wait (NULL: none yet).
    reserved_at: Mapped[float | None] = mapped_column(Float)


PAUSES: Table = FlowPause.__table__  # type: ignore[assignment]
ACTIONS: Table = FlowAction.__table__  # type: ignore[assignment]
RATES: Table = FlowRate.__table__  # type: ignore[assignment]
