"""Tasks of limited keys (``limit=N``) and of fair tenants (``fair=True``); each body
records its start and end, on the database's clock, in ``limit_probe`` of the journal's
own database, so a test reads every host's bodies in one place."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from sqlalchemy import text

from jobsapp.celery_app import app
from jobsapp.db import get_engine
from jobsapp.lifecycle import current_run, lifecycle_task
from tests.support.tasks import _key, counter

LIMIT = 3
PROBE_DDL = """CREATE TABLE IF NOT EXISTS limit_probe (
    job_id uuid PRIMARY KEY, task text NOT NULL, key text NOT NULL,
    started_at timestamptz NOT NULL, ended_at timestamptz)"""


def _started(job_id: str, task: str, key: str) -> None:
    with get_engine().begin() as conn:
        conn.execute(
            text(
                "INSERT INTO limit_probe (job_id, task, key, started_at) "
                "VALUES (:j, :t, :k, clock_timestamp())"
            ),
            {"j": job_id, "t": task, "k": key},
        )


def _ended(job_id: str) -> None:
    with get_engine().begin() as conn:
        conn.execute(
            text("UPDATE limit_probe SET ended_at = clock_timestamp() WHERE job_id = :j"),
            {"j": job_id},
        )


def probed(job_id: str, task: str, key: str, seconds: float) -> None:
    _started(job_id, task, key)
    time.sleep(seconds)
    _ended(job_id)


@lifecycle_task(app, name="tests.limited", key="{tenant}", limit=LIMIT)
def limited(tenant: str, seconds: float) -> None:
    probed(str(current_run().job_id), "limited", tenant, seconds)


@lifecycle_task(app, name="tests.fair_tenant", key="{tenant}", fair=True)
def fair_tenant(tenant: str, seconds: float) -> None:
    probed(str(current_run().job_id), "fair", tenant, seconds)


@lifecycle_task(app, name="tests.limited_plain", key="{tenant}", limit=LIMIT)
def limited_plain(tenant: str, seconds: float) -> None:
    del tenant
    time.sleep(seconds)


def main(argv: list[str]) -> int:
    """``python -m tests.support.limit_tasks TASK '<json list of [tenant, seconds]>'``:
    a producer process, enqueuing in the given order (fast-path publish after COMMIT)."""
    task, calls = app.tasks[argv[0]], json.loads(argv[1])
    for tenant, seconds in calls:
        task.apply_async((tenant, seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


@lifecycle_task(app, name="tests.limited_completing", key="{tenant}", limit=LIMIT)
def limited_completing(tenant: str) -> None:
    """Commits its own writes with the success (``RunContext.completing``)."""
    del tenant
    with current_run().completing():
        pass


@lifecycle_task(
    app, name="tests.limited_looping", key="{tenant}", limit=LIMIT, heartbeat_interval=0.2
)
def limited_looping(tenant: str, seconds: float) -> None:
    """Loops until ``seconds`` pass or its heartbeat stops it (a revoke)."""
    del tenant
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)


# ``limited_held``: bodies that hold their slots until the test lets them go, counting how
# many of one token's bodies run at once (any process: the counters are in Redis).
HELD_QUEUE = "tests-limits-held"
HOLD_AT_MOST = 90.0  # seconds: a test that fails before its ``let_go`` does not hang


def _held(token: str, what: str) -> str:
    return _key(f"held:{token}:{what}")


def arm_failure(token: str) -> None:
    """The next body of ``token`` fails (once)."""
    counter().set(_held(token, "fail"), 1)


def let_go(token: str) -> None:
    counter().set(_held(token, "go"), 1)


def started(token: str) -> set[str]:
    """The job ids whose bodies started (and did not fail at once)."""
    members = counter().smembers(_held(token, "started"))
    return {j.decode() if isinstance(j, bytes) else j for j in members}


def most_at_once(token: str) -> int:
    """The most bodies of ``token`` seen running at one instant."""
    return max((int(n) for n in counter().lrange(_held(token, "at_once"), 0, -1)), default=0)


@lifecycle_task(
    app,
    name="tests.limited_held",
    key="{tenant}",
    limit=LIMIT,
    max_attempts=1,
    queue=HELD_QUEUE,
    dedup_window=0,
)
def limited_held(tenant: str, token: str) -> None:
    del tenant
    client = counter()
    if client.delete(_held(token, "fail")):
        raise RuntimeError("armed to fail once")
    client.sadd(_held(token, "started"), str(current_run().job_id))
    client.rpush(_held(token, "at_once"), client.incr(_held(token, "running")))
    try:
        deadline = time.monotonic() + HOLD_AT_MOST
        while not client.exists(_held(token, "go")) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        client.decr(_held(token, "running"))


@lifecycle_task(app, name="tests.limited_lineage", key="{tenant}", limit=2, bind=True)
def limited_lineage(self: Any, tenant: str) -> list[str | None]:
    """What Celery gives the body as its ``root_id`` and ``parent_id``."""
    del tenant
    return [self.request.root_id, self.request.parent_id]


@lifecycle_task(app, name="tests.fair_lineage", key="{tenant}", fair=True, bind=True)
def fair_lineage(self: Any, tenant: str) -> list[str | None]:
    """What Celery gives the body as its ``root_id`` and ``parent_id``."""
    del tenant
    return [self.request.root_id, self.request.parent_id]
