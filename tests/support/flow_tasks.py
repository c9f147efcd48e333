"""Tasks the flow-control tests drive: each start is recorded in Redis, any process sees it."""

from __future__ import annotations

import json

from jobsapp.celery_app import app
from jobsapp.lifecycle import current_run, lifecycle_task
from tests.support.tasks import _key, counter, record

RATE = 10  # starts per second of ``rated``


def record_start(token: str) -> None:
    """Count the body's start under ``token`` and keep the start its rate was charged at."""
    record(token)
    started = current_run().row.started_at
    counter().rpush(_key(f"{token}:starts"), json.dumps(started.timestamp()))


def starts(token: str) -> list[float]:
    """When each recorded run started (the database's clock), earliest first."""
    return sorted(float(json.loads(s)) for s in counter().lrange(_key(f"{token}:starts"), 0, -1))


@lifecycle_task(app, name="tests.flow.rated", rate=f"{RATE}/s", dedup_window=0)
def rated(token: str) -> None:
    record_start(token)


@lifecycle_task(app, name="tests.flow.per_tenant", rate="1/m", rate_key="{tenant}", dedup_window=0)
def per_tenant(tenant: str, token: str) -> None:
    del tenant
    record_start(token)


@lifecycle_task(app, name="tests.flow.plain", dedup_window=0)
def plain(token: str) -> None:
    record(token)
