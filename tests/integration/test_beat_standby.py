"""What a beat that does not lead says: the real holder, or that the database is gone."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine

from jobsapp.maintenance import lease, scheduler
from jobsapp.maintenance.scheduler import LEASE_NAME
from tests.support.attachments import environment


def test_the_standby_line_names_the_beat_that_holds_the_lease(db: Engine) -> None:
    with db.begin() as conn:
        lease.acquire(
            conn,
            LEASE_NAME,
            "host-a:42:beat",
            ttl=timedelta(seconds=60),
            now=lease.database_now(conn),
        )

    line = scheduler.standby_line("host-b:7:beat", LEASE_NAME)

    assert line.startswith(
        "beat host-b:7:beat standing by: the lease is held by beat host-a:42:beat until "
    )


def test_the_standby_line_says_when_the_database_cannot_be_reached() -> None:
    dead = "postgresql+psycopg2://postgres:hunter2@127.0.0.1:9/none"
    with environment(JOBSAPP_DATABASE_URL=dead):
        line = scheduler.standby_line("host-b:7:beat", LEASE_NAME)

    assert line.startswith(
        "beat host-b:7:beat standing by: cannot reach the database at "
        "JOBSAPP_DATABASE_URL=postgresql+psycopg2://postgres:***@127.0.0.1:9/none"
        ": "
    )
    assert "held by" not in line
    assert "hunter2" not in line
