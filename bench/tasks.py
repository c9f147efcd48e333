"""The completion counter every system's no-op job increments, and jobsapp's no-op job.

A job counts itself done with one Redis INCR; the driver resets the counter before each
phase and waits on it. It lives on the bench's own Redis (``BENCH_COUNTER_URL``). The
worker loads this module through ``JOBSAPP_IMPORTS=bench.tasks``.
"""

from __future__ import annotations

import os

import redis

DONE_KEY = "bench:done"
_counter = redis.Redis.from_url(os.environ.get("BENCH_COUNTER_URL", "redis://127.0.0.1:15402/6"))


def count_done() -> None:
    _counter.incr(DONE_KEY)
