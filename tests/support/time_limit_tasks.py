"""The time-limit bodies (time_limit_bodies.py) as lifecycle tasks, with the options of
their bare Celery twins (bare_time_limits.py) plus the journal's retry budget."""

from __future__ import annotations

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from tests.support import time_limit_bodies as bodies
from tests.support.tasks import FAST_RETRY

# Killed at its limit on every attempt: retried once, then failed.
hang = lifecycle_task(
    app,
    name="tests.time_limits.hang",
    time_limit=bodies.TIME_LIMIT,
    max_attempts=2,
    retry_policy=FAST_RETRY,
)(bodies.hang)
# No limit of its own: a call's apply_async(time_limit=...) bounds each of its attempts.
hang_per_call = lifecycle_task(
    app, name="tests.time_limits.hang_per_call", max_attempts=2, retry_policy=FAST_RETRY
)(bodies.hang)
soft = lifecycle_task(
    app,
    name="tests.time_limits.soft",
    soft_time_limit=bodies.SOFT_LIMIT,
    time_limit=bodies.TIME_LIMIT + 5,
)(bodies.soft)
# One run per token at a time: the limit must free the key of a body that still hangs.
hang_keyed = lifecycle_task(
    app,
    name="tests.time_limits.hang_keyed",
    key="{token}",
    time_limit=bodies.TIME_LIMIT,
    max_attempts=1,
)(bodies.hang)
spin = lifecycle_task(
    app, name="tests.time_limits.spin", time_limit=bodies.TIME_LIMIT, max_attempts=1
)(bodies.spin)
