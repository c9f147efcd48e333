"""A deployment's ``beat_schedule`` never drops a maintenance pass (maintenance/entries.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from jobsapp.maintenance.entries import with_maintenance
from jobsapp.settings import SettingsError

SHIPPED: dict[str, Any] = {
    "reaper": {"task": "jobsapp.maintenance.reaper", "schedule": timedelta(seconds=15)},
    "outbox-relay": {"task": "jobsapp.maintenance.relay", "schedule": timedelta(seconds=2)},
}
RATES = {"refresh-rates": {"task": "billing.refresh_rates", "schedule": 30.0}}


def tasks(schedule: dict[str, Any]) -> dict[str, str]:
    return {name: spec["task"] for name, spec in schedule.items()}


def test_a_deployments_own_entries_run_beside_every_maintenance_pass() -> None:
    assert tasks(with_maintenance(SHIPPED, RATES)) == {
        "reaper": "jobsapp.maintenance.reaper",
        "outbox-relay": "jobsapp.maintenance.relay",
        "refresh-rates": "billing.refresh_rates",
    }


def test_a_deployment_may_change_a_passes_cadence() -> None:
    slower = {"reaper": {"task": "jobsapp.maintenance.reaper", "schedule": 60.0}}
    merged = with_maintenance(SHIPPED, slower)
    assert merged["reaper"]["schedule"] == 60.0
    assert set(merged) == {"reaper", "outbox-relay"}


def test_a_pass_under_a_name_of_the_deployments_own_runs_once_not_twice() -> None:
    renamed = {"my-reaper": {"task": "jobsapp.maintenance.reaper", "schedule": 30.0}}
    assert tasks(with_maintenance(SHIPPED, renamed)) == {
        "my-reaper": "jobsapp.maintenance.reaper",
        "outbox-relay": "jobsapp.maintenance.relay",
    }


def test_merging_twice_changes_nothing() -> None:
    once = with_maintenance(SHIPPED, RATES)
    assert with_maintenance(SHIPPED, once) == once


@pytest.mark.parametrize(
    "schedule",
    [
        {"reaper": None},
        {"reaper": {"task": "billing.refresh_rates", "schedule": 30.0}},
    ],
    ids=["removed", "name-reused"],
)
def test_a_schedule_that_stops_a_pass_is_refused_in_one_line(schedule: dict[str, Any]) -> None:
    with pytest.raises(SettingsError) as refused:
        with_maintenance(SHIPPED, schedule)
    said = str(refused.value)
    assert "\n" not in said
    assert "'reaper' would stop jobsapp.maintenance.reaper" in said
