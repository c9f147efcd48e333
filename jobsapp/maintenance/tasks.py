"""The maintenance passes as Celery tasks; beat's LeasedScheduler runs them in-process.

They may also be sent to a worker or run by ``jobsapp maintenance run-once``: every pass
is safe to run twice at once. ``JOBSAPP_REAPER_BATCH`` and ``JOBSAPP_RELAY_BATCH`` size
their batches (rows per transaction); the defaults suit a production backlog.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from jobsapp.celery_app import app
from jobsapp.db import get_engine
from jobsapp.maintenance import reaper, relay, retention
from jobsapp.settings import get_settings


def batch_from_env(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name}={raw!r} must be a whole number of rows, at least 1")
    return int(raw)


def reaper_config() -> reaper.ReaperConfig:
    settings = get_settings()
    return reaper.ReaperConfig(
        stale_after=timedelta(seconds=settings.stale_after),
        batch=batch_from_env(os.environ, "JOBSAPP_REAPER_BATCH", reaper.ReaperConfig.batch),
        unclaimed_after=timedelta(seconds=settings.unclaimed_after),
    )


def relay_config() -> relay.RelayConfig:
    return relay.RelayConfig(
        unclaimed_after=timedelta(seconds=get_settings().unclaimed_after),
        batch=batch_from_env(os.environ, "JOBSAPP_RELAY_BATCH", relay.RelayConfig.batch),
    )


@app.task(name="jobsapp.maintenance.reaper", ignore_result=True)
def reap() -> dict[str, int]:
    return reaper.run_once(get_engine(), reaper_config(), app)


@app.task(name="jobsapp.maintenance.relay", ignore_result=True)
def relay_outbox() -> dict[str, int]:
    return relay.run_once(app, get_engine(), relay_config())


@app.task(name="jobsapp.maintenance.retention", ignore_result=True)
def prune() -> dict[str, int]:
    return retention.run_once(get_engine(), retention.RetentionConfig())


PASSES: dict[str, Any] = {"reaper": reap, "relay": relay_outbox, "retention": prune}
