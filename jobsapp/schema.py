"""Every table jobsapp owns, for Alembic and the migration drift test."""

from __future__ import annotations

from jobsapp.lifecycle.tables import Base

metadata = Base.metadata
