"""Hard time limits (Celery's ``time_limit``): an attempt past its limit is ended in the
journal with Celery's ``TimeLimitExceeded`` and settled by the retry policy (retried or
failed; a limited key's slot freed with it), whoever notices first:

- the prefork pool kills the child at the limit; the worker's parent process, told by
  Celery (``Request.on_timeout``), writes the end the killed child cannot (``ended_by_pool``);
- under any pool, the process's heartbeat thread writes it at its first beat past the
  limit, stops renewing the lease and interrupts the body (``AtLimit``): the only limit
  under the threads and solo pools, which Celery cannot enforce.

Both are fenced by the attempt's claim, so one of them (or the body's own outcome, if it
came first) is written, never two. docs/lifecycle.md, "Time limits".

``revoke(terminate=True)`` is the pool's other kill of a child: the parent ends that attempt
cancelled the same way (``cancelled_by_pool``), instead of leaving it to the reaper.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from celery.worker.request import Request
from sqlalchemy.exc import OperationalError

from jobsapp.db import get_engine
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import Run
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules import message
from jobsapp.lifecycle.rules.states import State
from jobsapp.lifecycle.worker.attempt import AttemptRules, End, Ended, honour_cancel, time_out
from jobsapp.lifecycle.worker.context import RunContext
from jobsapp.lifecycle.worker.heartbeat import Heartbeat
from jobsapp.settings import get_settings

log = logging.getLogger(__name__)


def hard_limit(request_limits: Any, task_limit: float | None, app: Celery) -> float | None:
    """The attempt's hard limit as Celery's worker takes it: the message's ``timelimit``
    header (``apply_async(time_limit=...)``, hard first), else the task's ``time_limit``,
    else the app's ``task_time_limit``; None (or 0) is no limit."""
    from_message = request_limits[0] if request_limits else None
    seconds = from_message or task_limit or app.conf.task_time_limit
    return float(seconds) if seconds else None


@dataclass
class AtLimit:
    """The heartbeat's end of an attempt past its hard limit (``Heartbeat.limit``); the
    attempt's outcome once written, which the task reports instead of the lost lease."""

    app: Celery
    ctx: RunContext
    rules: AttemptRules
    seconds: float
    ended: Ended | None = field(default=None)

    def __call__(self) -> None:
        log.error(
            "job %s attempt %s: hard time limit (%gs) exceeded; ended by the journal",
            self.ctx.job_id,
            self.ctx.attempt,
            self.seconds,
        )
        self.ended = time_out(self.app, self.ctx, self.rules, self.seconds)

    def instead_of(self, ended: Ended) -> Ended:
        """What the attempt reports: the limit's end where it, not the body, wrote one."""
        if ended.end is End.LEASE_LOST and self.ended and self.ended.end is not End.LEASE_LOST:
            return self.ended
        return ended


def ended_by_pool(request: Request, seconds: float) -> None:
    """In the worker's parent, as the prefork pool kills the child running ``request``'s
    attempt at its hard limit: end the attempt in the journal, if that child still holds
    it. A database that cannot be reached leaves it to the reaper (a stale heartbeat)."""
    held = _held_attempt(request, "hard time limit")
    if held is not None:
        task, ctx = held
        rules = task.attempt_rules(get_settings().inline_wait_max)
        _or_the_reaper(ctx, "hard time limit", lambda: time_out(task.app, ctx, rules, seconds))


def cancelled_by_pool(request: Request) -> None:
    """In the worker's parent, as ``revoke(terminate=True)`` has the pool kill the child
    running ``request``'s attempt: end it cancelled, as its heartbeat would have at the
    cancel request the revoke wrote first (lifecycle/celery_api/revoke.py)."""
    held = _held_attempt(request, "revoke(terminate=True)")
    if held is not None:
        task, ctx = held
        _or_the_reaper(ctx, "revoke(terminate=True)", lambda: honour_cancel(task.app, ctx))


def _held_attempt(request: Request, why: str) -> tuple[Any, RunContext] | None:
    """The lifecycle task and the attempt's context, if the killed child still held it."""
    task: Any = request.task  # a LifecycleTask (task.py imports this module)
    spec: RunTable | None = getattr(task, "run_table", None)
    if spec is None or request.worker_pid is None:
        return None
    job_id, attempt = _attempt_of(request)
    worker = f"{request.hostname}:{request.worker_pid}"
    settings = get_settings()
    engine = get_engine()
    try:
        with engine.connect() as conn:
            row = journal.load(conn, spec, job_id)
    except OperationalError as down:
        log.warning("job %s: %s not recorded (%s); the reaper frees it", job_id, why, _name(down))
        return None
    if row is None or not _held_by(row, worker, attempt):
        return None
    beat = Heartbeat(
        engine,
        spec,
        job_id,
        row.attempts,
        settings.heartbeat_interval,
        settings.stale_after,
        token=row.claimed_token,
    )
    return task, RunContext(engine=engine, spec=spec, row=row, worker=worker, heartbeat=beat)


def _or_the_reaper(ctx: RunContext, why: str, write: Callable[[], object]) -> None:
    try:
        write()
    except OperationalError as down:
        log.warning(
            "job %s: %s not recorded (%s); the reaper frees it", ctx.job_id, why, _name(down)
        )


def _name(down: OperationalError) -> str:
    return type(down.orig).__name__


def _attempt_of(request: Request) -> tuple[uuid.UUID, int | None]:
    """The job and attempt a delivery names (a plain Celery call: its job, any attempt)."""
    args, kwargs = tuple(request.args), dict(request.kwargs)
    if message.is_envelope(args, kwargs):
        env = message.parse(args, kwargs)
        return env.job_id, env.attempt
    return message.job_id_of_task(request.id), None


def _held_by(row: Run, worker: str, attempt: int | None) -> bool:
    """Whether the killed child's claim still holds the run (not ended meanwhile)."""
    return (
        row.state == State.RUNNING.value
        and row.worker == worker
        and (attempt is None or row.attempts == attempt)
    )
