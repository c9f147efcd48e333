"""A plain Celery app (Redis broker and result backend) with the time-limit bodies, as a
Celery user declares them: ``celery -A tests.support.bare_time_limits worker``, with the
broker in ``JOBSAPP_TEST_REDIS_URL`` and the queue in ``BARE_QUEUE``."""

from __future__ import annotations

import os

from celery import Celery

from tests.support import time_limit_bodies as bodies

QUEUE = "BARE_QUEUE"

app = Celery(
    "bare-time-limits",
    broker=os.environ.get("JOBSAPP_TEST_REDIS_URL", "memory://"),
    backend=os.environ.get("JOBSAPP_TEST_REDIS_URL"),
    set_as_current=False,
)
app.conf.task_default_queue = os.environ.get(QUEUE, "celery")

hang = app.task(name="bare.time_limits.hang", time_limit=bodies.TIME_LIMIT)(bodies.hang)
soft = app.task(
    name="bare.time_limits.soft",
    soft_time_limit=bodies.SOFT_LIMIT,
    time_limit=bodies.TIME_LIMIT + 5,
)(bodies.soft)
