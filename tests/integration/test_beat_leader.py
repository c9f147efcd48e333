"""``jobsapp maintenance leader``: beat's health check in docker-compose.yml."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine

from jobsapp import cli
from jobsapp.maintenance import lease
from jobsapp.maintenance.scheduler import LEASE_NAME


def test_no_leader_is_unhealthy(db: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["maintenance", "leader"]) == 1
    assert "no beat holds the maintenance lease" in capsys.readouterr().err


def test_a_live_lease_is_healthy_and_named(db: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    with db.begin() as conn:
        lease.acquire(conn, LEASE_NAME, "host:42:beat", ttl=timedelta(seconds=60),
                      now=lease.database_now(conn))  # fmt: skip

    assert cli.main(["maintenance", "leader"]) == 0
    assert "host:42:beat" in capsys.readouterr().out


def test_an_expired_lease_is_unhealthy(db: Engine) -> None:
    with db.begin() as conn:
        past = lease.database_now(conn) - timedelta(minutes=5)
        lease.acquire(conn, LEASE_NAME, "host:42:beat", ttl=timedelta(seconds=30), now=past)

    assert cli.main(["maintenance", "leader"]) == 1
