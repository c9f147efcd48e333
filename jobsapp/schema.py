"""Every table jobsapp owns, for Alembic and the migration drift test."""

from __future__ import annotations

import jobsapp.attachments.models  # noqa: F401 - registers the attachment tables on Base
from jobsapp.lifecycle.journal import flow_tables  # noqa: F401 - registers the flow-control tables
from jobsapp.lifecycle.journal.tables import Base
from jobsapp.web import session_tables  # noqa: F401 - registers the console's session tables

metadata = Base.metadata
