"""The lifecycle engine's public face: the base Task and its decorator, the errors a body
raises, the run a body sees, and ``transaction`` (enqueues that commit with the caller's
writes). The floors under it are drawn in docs/architecture.md."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery import Celery

    from jobsapp.lifecycle.celery_api.handle import JobHandle
    from jobsapp.lifecycle.journal import EnqueueOutcome
    from jobsapp.lifecycle.journal.registry import RunTable, StalePolicy
    from jobsapp.lifecycle.producer.enqueue import transaction
    from jobsapp.lifecycle.rules.errors import (
        InvalidMessage,
        LeaseLost,
        PermanentError,
        RetryAfter,
        TransientError,
    )
    from jobsapp.lifecycle.rules.retry import RetryPolicy
    from jobsapp.lifecycle.rules.states import Outcome, State
    from jobsapp.lifecycle.task import LifecycleTask
    from jobsapp.lifecycle.worker.context import RunContext, current_run

# Imported on first use, so that importing one floor (a pure rule, the journal's tables)
# does not load the whole engine: `jobsapp --help` and a team's unit tests pay for what
# they touch.
_HOMES = {
    "JobHandle": "celery_api.handle",
    "EnqueueOutcome": "journal",
    "RunTable": "journal.registry",
    "StalePolicy": "journal.registry",
    "transaction": "producer.enqueue",
    "InvalidMessage": "rules.errors",
    "LeaseLost": "rules.errors",
    "PermanentError": "rules.errors",
    "RetryAfter": "rules.errors",
    "TransientError": "rules.errors",
    "RetryPolicy": "rules.retry",
    "Outcome": "rules.states",
    "State": "rules.states",
    "LifecycleTask": "task",
    "RunContext": "worker.context",
    "current_run": "worker.context",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "EnqueueOutcome",
    "InvalidMessage",
    "JobHandle",
    "LeaseLost",
    "LifecycleTask",
    "Outcome",
    "PermanentError",
    "RetryAfter",
    "RetryPolicy",
    "RunContext",
    "RunTable",
    "StalePolicy",
    "State",
    "TransientError",
    "current_run",
    "lifecycle_task",
    "transaction",
]


def lifecycle_task(app: Celery, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``@app.task`` with ``LifecycleTask`` as base and the journal's settings; a ``base``
    of the team's own (or the app's ``task_cls``) stays, behind ``LifecycleTask``.

    Options besides Celery's: ``run_table``, ``key`` (a format string over the task's
    keyword values, or a function), ``max_attempts``, ``dedup_window`` (seconds),
    ``retry_policy``, ``permanent_errors``, ``heartbeat_interval``, ``inline_wait_max``,
    ``max_snoozes``, ``limit`` (runs of one key at once), ``fair`` and ``fair_window``
    (round-robin between keys; docs/flow-control.md),
    ``rate`` (a global rate limit, ``"100/m"``) and ``rate_key`` (one rate
    per key: a format string like ``key``); Celery's per-worker ``rate_limit`` is refused.
    """
    from jobsapp.lifecycle.celery_api import backend, task_hooks
    from jobsapp.lifecycle.task import LifecycleTask
    from jobsapp.lifecycle.workflows import canvas

    # A team's base class (or the app's task_cls) keeps its hooks and its __call__.
    options["base"] = task_hooks.lifecycle_base(app, options.get("base"), LifecycleTask)
    if not app.conf.result_backend:
        # Celery's readers of results (AsyncResult(id), GroupResult.restore) ask the
        # app's backend: with none, the journal answers them.
        app.conf.update(result_backend=backend.NAME)
    # Declared on an app: its canvases go through the journal from now on, even before
    # Celery binds the task (an app not finalized yet binds it at its first use).
    canvas.install()
    return app.task(**options)  # type: ignore[no-any-return]
