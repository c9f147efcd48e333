"""``jobsapp maintenance leader``: beat's health check in docker-compose.yml: some beat holds
the lease, and every maintenance pass ran within its cadence (plus the lease)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine

from jobsapp import cli
from jobsapp.maintenance import lease
from jobsapp.maintenance.scheduler import LEASE_NAME

PASSES = cli.maintenance_passes()


def lead(db: Engine) -> None:
    with db.begin() as conn:
        lease.acquire(
            conn,
            LEASE_NAME,
            "host:42:beat",
            ttl=timedelta(seconds=60),
            now=lease.database_now(conn),
        )


def stamp(db: Engine, task: str, *, ago: float = 0.0, every: float = 15.0) -> None:
    with db.begin() as conn:
        ran = lease.database_now(conn) - timedelta(seconds=ago)
        lease.stamp(
            conn, lease.STAMP_PREFIX + task, "host:42:beat", now=ran, ttl=timedelta(seconds=every)
        )


def test_no_leader_is_unhealthy(db: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["maintenance", "leader"]) == 1
    assert "no beat holds the maintenance lease" in capsys.readouterr().err


def test_a_live_lease_with_every_pass_on_time_is_healthy_and_named(
    db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    lead(db)
    for task in PASSES:
        stamp(db, task)

    assert cli.main(["maintenance", "leader"]) == 0
    assert "host:42:beat" in capsys.readouterr().out


def test_the_shipped_passes_are_what_the_check_expects() -> None:
    assert {
        "jobsapp.maintenance.reaper",
        "jobsapp.maintenance.relay",
        "jobsapp.maintenance.retention",
    } <= set(PASSES)


def test_a_leader_whose_pass_never_ran_is_unhealthy_and_names_it(
    db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    lead(db)
    for task in PASSES[1:]:
        stamp(db, task)

    assert cli.main(["maintenance", "leader"]) == 1
    said = capsys.readouterr().err
    assert f"{PASSES[0]} (last run: never)" in said
    assert PASSES[1] not in said


def test_a_pass_overdue_past_its_cadence_is_unhealthy_until_it_runs_again(db: Engine) -> None:
    lead(db)
    for task in PASSES:
        stamp(db, task)
    stamp(db, PASSES[0], ago=60.0, every=15.0)  # older than the row: changes nothing
    assert cli.main(["maintenance", "leader"]) == 0

    with db.begin() as conn:
        first = lease.LEASES.c.name == lease.STAMP_PREFIX + PASSES[0]
        conn.execute(lease.LEASES.delete().where(first))
    stamp(db, PASSES[0], ago=60.0, every=15.0)
    assert cli.main(["maintenance", "leader"]) == 1
    stamp(db, PASSES[0])
    assert cli.main(["maintenance", "leader"]) == 0


def test_an_expired_lease_is_unhealthy(db: Engine) -> None:
    with db.begin() as conn:
        past = lease.database_now(conn) - timedelta(minutes=5)
        lease.acquire(conn, LEASE_NAME, "host:42:beat", ttl=timedelta(seconds=30), now=past)

    assert cli.main(["maintenance", "leader"]) == 1
