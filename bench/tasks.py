"""No-op tasks for the throughput benchmark: one bare Celery, one with the lifecycle."""

from __future__ import annotations

import os

import redis

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task

_counter = redis.Redis.from_url(os.environ.get("BENCH_COUNTER_URL", "redis://127.0.0.1:6390/6"))


@app.task(name="bench.bare", ignore_result=True, acks_late=True)
def bare() -> None:
    _counter.incr("bench:done:bare")


@lifecycle_task(app, name="bench.lifecycle")
def with_lifecycle() -> None:
    _counter.incr("bench:done:lifecycle")
