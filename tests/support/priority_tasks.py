"""Tasks of the priority tests: a gate that holds a worker's one slot until the test opens
it, and a body that records the order in which jobs ran (in Redis, seen by any process)."""

from __future__ import annotations

import time

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from tests.support.tasks import counter

# The longest the gate holds its slot if the test never opens it.
GATE_LIMIT = 60.0


def key(token: str, what: str) -> str:
    return f"jobsapp-test:priorities:{token}:{what}"


@lifecycle_task(app, name="tests.priorities.gate", dedup_window=0)
def gate(token: str) -> None:
    redis = counter()
    redis.set(key(token, "gate"), "held")
    deadline = time.monotonic() + GATE_LIMIT
    while redis.get(key(token, "gate")) != b"open" and time.monotonic() < deadline:
        time.sleep(0.05)


@lifecycle_task(app, name="tests.priorities.ordered", dedup_window=0)
def ordered(token: str, label: str) -> None:
    counter().rpush(key(token, "order"), label)
