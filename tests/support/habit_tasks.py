"""A task with a queue of its own, for the tests of Celery habits (queues, priorities)."""

from __future__ import annotations

import os

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from tests.support.tasks import FAST_RETRY, record

# Per test session, so two sessions' workers on one Redis never take each other's jobs.
QUEUE_B = f"habits-b-{os.environ.get('JOBSAPP_TEST_NAMESPACE', 'local')}"


@lifecycle_task(app, name="tests.habits.on_b", queue=QUEUE_B, retry_policy=FAST_RETRY)
def on_b(token: str, fail_times: int = 0) -> None:
    if record(token) <= fail_times:
        raise ConnectionError("upstream down")


# Celery's typing=False: a call is not checked against the body where it is made.
@lifecycle_task(app, name="tests.habits.untyped", typing=False, retry_policy=FAST_RETRY)
def untyped(token: str) -> None:
    record(token)


@lifecycle_task(app, name="tests.habits.untyped_keyed", typing=False, key="untyped:{token}")
def untyped_keyed(token: str) -> None:
    record(token)
