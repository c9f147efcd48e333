"""Lifecycle tasks of the testing kit's own tests (tests/integration/test_testing_kit.py):
each body appends to ``RAN``, so a test sees what ran and in which order."""

from __future__ import annotations

from jobsapp.celery_app import app
from jobsapp.lifecycle import PermanentError, RetryPolicy, lifecycle_task

# Bodies append here, in the order they ran.
RAN: list[str] = []


@lifecycle_task(app, name="tests.kit.flaky", retry_policy=RetryPolicy(base_delay=60, jitter=0))
def flaky(name: str, failures: int) -> str:
    """Fails its first ``failures`` attempts; the backoff is 60 s, then 120 s."""
    RAN.append(name)
    if RAN.count(name) <= failures:
        raise ConnectionError(f"{name}: upstream unreachable")
    return f"{name} done"


@lifecycle_task(app, name="tests.kit.quick_retry", retry_policy=RetryPolicy(base_delay=2, jitter=0))
def quick_retry(name: str) -> str:
    """A 2 s backoff: within the inline wait (2 s in the suite), so it rides a countdown."""
    RAN.append(name)
    if RAN.count(name) == 1:
        raise ConnectionError("once")
    return f"{name} done"


@lifecycle_task(app, name="tests.kit.step")
def step(said: str, word: str) -> str:
    RAN.append(word)
    return f"{said} {word}"


@lifecycle_task(app, name="tests.kit.export", key="export:{account}", limit=2)
def export(account: str, part: int) -> int:
    RAN.append(f"{account}/{part}")
    return part


@lifecycle_task(app, name="tests.kit.report", key="report:{account}")
def report(account: str) -> str:
    return account


@lifecycle_task(app, name="tests.kit.charge")
def charge(account: str) -> str:
    raise PermanentError(f"no such account {account}")


@app.task(name="tests.kit.plain")
def plain(word: str) -> None:
    """A plain Celery task beside the lifecycle ones: its message is the broker's alone."""
    RAN.append(word)
