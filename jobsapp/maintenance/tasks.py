"""The maintenance passes as Celery tasks; beat's LeasedScheduler runs them in-process.

They may also be sent to a worker or run by ``jobsapp maintenance run-once``: every pass
is safe to run twice at once.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from jobsapp.celery_app import app
from jobsapp.db import get_engine
from jobsapp.maintenance import reaper, relay, retention
from jobsapp.settings import get_settings


def reaper_config() -> reaper.ReaperConfig:
    return reaper.ReaperConfig(stale_after=timedelta(seconds=get_settings().stale_after))


def relay_config() -> relay.RelayConfig:
    return relay.RelayConfig(unclaimed_after=timedelta(seconds=get_settings().unclaimed_after))


@app.task(name="jobsapp.maintenance.reaper", ignore_result=True)
def reap() -> dict[str, int]:
    return reaper.run_once(get_engine(), reaper_config())


@app.task(name="jobsapp.maintenance.relay", ignore_result=True)
def relay_outbox() -> dict[str, int]:
    return relay.run_once(app, get_engine(), relay_config())


@app.task(name="jobsapp.maintenance.retention", ignore_result=True)
def prune() -> dict[str, int]:
    return retention.run_once(get_engine(), retention.RetentionConfig())


PASSES: dict[str, Any] = {"reaper": reap, "relay": relay_outbox, "retention": prune}
