"""Tasks of the priority tests: a body that records the order in which jobs ran (in Redis,
seen by any process)."""

from __future__ import annotations

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from tests.support.tasks import counter


def key(token: str, what: str) -> str:
    return f"jobsapp-test:priorities:{token}:{what}"


@lifecycle_task(app, name="tests.priorities.ordered", dedup_window=0)
def ordered(token: str, label: str) -> None:
    counter().rpush(key(token, "order"), label)
