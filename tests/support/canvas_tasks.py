"""The small tasks of Celery's own canvas tests (t/integration/tasks.py: add, tsum,
identity, fail), as lifecycle tasks and as bodies a bare Celery app runs the same."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from tests.support.tasks import FAST_RETRY, record


def _add(x: int, y: int) -> int:
    return x + y


def _tsum(nums: list[int]) -> int:
    return sum(nums)


def _identity(x: Any) -> Any:
    return x


def _fail(token: str) -> None:
    record(token)
    raise ValueError(f"expected failure of {token}")


def _counted(x: int, token: str) -> int:
    """``x`` back (a parent's result comes first), counting each run under ``token``."""
    record(token)
    return x


def _flaky_add(x: int, token: str, fail_times: int) -> int:
    """``x + 1``, after failing its first ``fail_times`` runs."""
    if record(token) <= fail_times:
        raise ConnectionError("upstream down")
    return x + 1


def _calls_add(x: int) -> list[str]:
    """Calls ``add`` twice from its body, the second with ``add_to_parent=False``."""
    return [add.delay(x, 1).id, add.apply_async((x, 2), add_to_parent=False).id]


# Runs of ``calls_at_first_run`` by token, in this process (the in-process worker's).
_RUNS: dict[str, int] = {}


def _calls_at_first_run(token: str) -> list[str]:
    """Calls ``add`` from its body at its first run only (a rerun of the job calls nothing)."""
    _RUNS[token] = _RUNS.get(token, 0) + 1
    return [add.delay(1, 1).id] if _RUNS[token] == 1 else []


BODIES: dict[str, Callable[..., Any]] = {
    "add": _add,
    "tsum": _tsum,
    "identity": _identity,
    "fail": _fail,
}

add = lifecycle_task(app, name="tests.canvas.add")(_add)
tsum = lifecycle_task(app, name="tests.canvas.tsum")(_tsum)
identity = lifecycle_task(app, name="tests.canvas.identity")(_identity)
fail = lifecycle_task(app, name="tests.canvas.fail", max_attempts=1)(_fail)
counted = lifecycle_task(app, name="tests.canvas.counted")(_counted)
calls_add = lifecycle_task(app, name="tests.canvas.calls_add")(_calls_add)
calls_at_first_run = lifecycle_task(app, name="tests.canvas.calls_at_first_run")(
    _calls_at_first_run
)
flaky_add = lifecycle_task(
    app, name="tests.canvas.flaky_add", max_attempts=3, retry_policy=FAST_RETRY
)(_flaky_add)
# Fails for good at its first failure: the operator's replay is what takes it again.
flaky_once = lifecycle_task(app, name="tests.canvas.flaky_once", max_attempts=1)(_flaky_add)
