"""A Celery user's first tasks, as lifecycle tasks and as bare Celery tasks of the same body.

The bare twins live on an app of their own (no broker needed: they run eagerly), so a test
can put what Celery answers beside what jobsapp answers.
"""

from __future__ import annotations

from celery import Celery

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from tests.support.tasks import FAST_RETRY, record

bare = Celery("bare")


def _add(x: int, y: int) -> int:
    return x + y


def _refuse(token: str) -> None:
    record(token)
    raise ValueError(f"no way, {token}")


def _shaky(token: str, fail_times: int) -> str:
    if record(token) <= fail_times:
        raise ConnectionError("upstream down")
    return f"{token} done"


add = lifecycle_task(app, name="tests.hour.add")(_add)
refuse = lifecycle_task(app, name="tests.hour.refuse", max_attempts=2, retry_policy=FAST_RETRY)(
    _refuse
)
shaky = lifecycle_task(app, name="tests.hour.shaky", max_attempts=3, retry_policy=FAST_RETRY)(
    _shaky
)

bare_add = bare.task(name="bare.add")(_add)
bare_refuse = bare.task(name="bare.refuse")(_refuse)
