"""Tasks the lifecycle tests drive; effects are counted in Redis so any process can see them."""

from __future__ import annotations

import os
import time

import redis

from jobsapp.celery_app import app
from jobsapp.lifecycle import RetryAfter, RetryPolicy, current_run, lifecycle_task

FAST_RETRY = RetryPolicy(base_delay=0.3, max_delay=1.0, jitter=0.0)


def counter() -> redis.Redis:
    return redis.Redis.from_url(os.environ["JOBSAPP_TEST_REDIS_URL"])


def record(name: str) -> int:
    """Count one execution of a body under ``name``; returns the count so far."""
    return int(counter().incr(f"jobsapp-test:calls:{name}"))


def calls(name: str) -> int:
    return int(counter().get(f"jobsapp-test:calls:{name}") or 0)


@lifecycle_task(app, name="tests.echo", dedup_window=0)
def echo(token: str) -> None:
    record(token)


@lifecycle_task(app, name="tests.windowed", dedup_window=1.0)
def windowed(token: str) -> None:
    record(token)


@lifecycle_task(app, name="tests.flaky", max_attempts=5, retry_policy=FAST_RETRY)
def flaky(token: str, fail_times: int, secret: str) -> None:
    if record(token) <= fail_times:
        raise ConnectionError(f"upstream down at postgresql://app:{secret}@db.internal/jobs")


@lifecycle_task(app, name="tests.doomed", max_attempts=2, retry_policy=FAST_RETRY)
def doomed(token: str) -> None:
    record(token)
    raise ValueError("this never works")


@lifecycle_task(app, name="tests.sleepy", key="sleepy:{token}")
def sleepy(token: str, seconds: float) -> None:
    record(token)
    ctx = current_run()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
    ctx.check_lease()
    record(f"{token}:published")


@lifecycle_task(app, name="tests.keyed", key="account:{account}")
def keyed(account: str, token: str, seconds: float = 0.0) -> None:
    record(token)
    time.sleep(seconds)


@lifecycle_task(app, name="tests.paused", max_attempts=3)
def paused(token: str, seconds: float) -> None:
    if record(token) == 1:
        raise RetryAfter(seconds, "rate limited upstream")
    record(f"{token}:done")


@lifecycle_task(
    app, name="tests.celery_retry", autoretry_for=(KeyError,), max_retries=2,
    retry_policy=FAST_RETRY,
)
def celery_retry(token: str) -> None:
    if record(token) < 3:
        raise KeyError("not yet")


@lifecycle_task(app, name="tests.tick")
def tick() -> None:
    """A task a foreign producer can call knowing only its name."""
    record(f"tick:{current_run().job_id}")
