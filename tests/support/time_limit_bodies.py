"""Bodies that outlive their time limit, each declared as a lifecycle task
(tests/support/time_limit_tasks.py) and as a plain Celery task (bare_time_limits.py) with
the same options. Nothing of jobsapp is imported here, so the bare worker is plain Celery.
Each call is recorded in the test Redis, so the test sees how often a body started."""

from __future__ import annotations

import os
import time

import redis
from celery.exceptions import SoftTimeLimitExceeded

# What the body sleeps: well past the limits below, short enough for a worker's shutdown.
HANG_SECONDS = 4.0
TIME_LIMIT = 1
SOFT_LIMIT = 1


def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ["JOBSAPP_TEST_REDIS_URL"])


def starts_key(token: str) -> str:
    return f"jobsapp-test:time-limits:{token}:starts"


def started(token: str) -> int:
    """How many times a body ran for ``token``."""
    return int(_redis().llen(starts_key(token)))


def _start(token: str) -> None:
    _redis().rpush(starts_key(token), time.time())


def hang(token: str, seconds: float = HANG_SECONDS) -> str:
    """Blocks in one call (time.sleep) past its limit: only a kill or the journal ends it."""
    _start(token)
    time.sleep(seconds)
    return "woke"


def spin(token: str, seconds: float) -> str:
    """Runs Python bytecode until ``seconds`` have passed: an interrupt stops it."""
    _start(token)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return "woke"


def soft(token: str) -> str:
    """Stops at its soft limit, as Celery's docs show: catch it, clean up, return."""
    _start(token)
    try:
        time.sleep(HANG_SECONDS)
    except SoftTimeLimitExceeded:
        return "cleaned up"
    return "woke"
