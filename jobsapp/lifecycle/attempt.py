"""One claimed attempt: heartbeat, body (with short Retry-After waits), outcome mapping."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.exc import OperationalError

from jobsapp import crashpoints
from jobsapp.db import autocommit
from jobsapp.lifecycle import journal, outbox
from jobsapp.lifecycle.context import RunContext, entered
from jobsapp.lifecycle.errors import LeaseLost, PermanentError, RetryAfter, RetryRequested
from jobsapp.lifecycle.journal import PendingMessage
from jobsapp.lifecycle.retry import Action, RetryPolicy, decide_failure, decide_retry_after
from jobsapp.lifecycle.scrub import describe_exception
from jobsapp.lifecycle.states import Outcome, Transition

log = logging.getLogger(__name__)

T = TypeVar("T")
# Pauses between attempts to write an outcome while the database is unreachable.
OUTCOME_WRITE_PAUSES = (0.5, 1.0, 2.0, 4.0)
# A body that keeps asking for short pauses is snoozed after this many inline waits.
MAX_INLINE_WAITS = 3


@dataclass(frozen=True)
class AttemptRules:
    policy: RetryPolicy
    permanent: tuple[type[BaseException], ...]
    inline_wait_max: float
    secrets: tuple[str, ...]
    # Long Retry-After pauses a job may take before it fails with ``snooze_limit``.
    max_snoozes: int = 10


def run_attempt(
    app: Celery, ctx: RunContext, body: Callable[[], Any], rules: AttemptRules
) -> None:
    """Run the body under the heartbeat, then write the one outcome it earned."""
    with ctx.heartbeat, entered(ctx):
        try:
            _call_with_waits(ctx, body, rules)
        except LeaseLost as lost:
            log.warning("%s; nothing published", lost)
            return
        except RetryAfter as pause:
            _snooze(app, ctx, pause, rules)
            return
        except Exception as exc:  # noqa: BLE001 - every failure becomes a journal outcome
            _settle_failure(app, ctx, exc, rules)
            return
    if not ctx.finished:
        _succeed(ctx)


def _call_with_waits(ctx: RunContext, body: Callable[[], Any], rules: AttemptRules) -> None:
    waits = 0
    while True:
        try:
            crashpoints.hit("mid_run")
            body()
            return
        except RetryAfter as pause:
            decision = decide_retry_after(pause.seconds, rules.inline_wait_max)
            waits += 1
            if decision.action is not Action.WAIT_INLINE or waits > MAX_INLINE_WAITS:
                raise
            log.info("job %s waits %.1fs inline: %s", ctx.job_id, pause.seconds, pause)
            ctx.heartbeat.wait(pause.seconds)


def _succeed(ctx: RunContext) -> None:
    def write() -> bool:
        with autocommit(ctx.engine) as conn:
            return journal.succeed(conn, ctx.spec, ctx.job_id, ctx.attempt, actor=ctx.worker)

    if not _persistently(write):
        log.warning("job %s attempt %s: finish refused, lease lost", ctx.job_id, ctx.attempt)


def _persistently(write: Callable[[], T]) -> T:
    """An outcome write survives a short database outage; past that the reaper decides."""
    for pause in OUTCOME_WRITE_PAUSES:
        try:
            return write()
        except OperationalError as down:
            log.warning("outcome write failed (%s); again in %.0fs", type(down.orig).__name__,
                        pause)  # fmt: skip
            time.sleep(pause)
    return write()


def _describe(exc: BaseException, rules: AttemptRules) -> str:
    cause = exc.cause if isinstance(exc, RetryRequested) and exc.cause else exc
    text = describe_exception(cause, secrets=rules.secrets)
    code = getattr(cause, "error_code", None)
    return f"[{code}] {text}" if isinstance(cause, PermanentError) and code else text


def _settle_failure(app: Celery, ctx: RunContext, exc: Exception, rules: AttemptRules) -> None:
    if isinstance(exc, SoftTimeLimitExceeded):
        exc = RetryRequested(exc, None)
    decision = decide_failure(
        exc, attempt=ctx.attempt, max_attempts=int(ctx.row["max_attempts"]),
        policy=rules.policy, permanent=rules.permanent,
    )  # fmt: skip
    delay = decision.delay
    if isinstance(exc, RetryRequested) and exc.countdown is not None:
        delay = exc.countdown
    error = _describe(exc, rules)
    if decision.action is Action.FAIL:
        assert decision.outcome is not None
        _fail(ctx, decision.outcome, error)
        return
    _requeue(app, ctx, delay, error, Transition.RETRY, rules, refund=False)


def _fail(ctx: RunContext, outcome: Outcome, error: str) -> None:
    def write() -> bool:
        with autocommit(ctx.engine) as conn:
            return journal.fail(conn, ctx.spec, ctx.job_id, ctx.attempt, outcome=outcome,
                                error=error, actor=ctx.worker)  # fmt: skip

    _persistently(write)
    log.info("job %s failed (%s): %s", ctx.job_id, outcome, error)


def _snooze(app: Celery, ctx: RunContext, pause: RetryAfter, rules: AttemptRules) -> None:
    reason = f"retry after {pause.seconds:g}s: {describe_exception(pause, secrets=rules.secrets)}"

    def taken() -> int:
        with ctx.engine.connect() as conn:
            return journal.snoozes(conn, ctx.spec, ctx.job_id)

    if _persistently(taken) >= rules.max_snoozes:
        _fail(ctx, Outcome.SNOOZE_LIMIT, f"{reason}; gave up after {rules.max_snoozes} snoozes")
        return
    _requeue(app, ctx, pause.seconds, reason, Transition.SNOOZE, rules, refund=True)


def _requeue(
    app: Celery, ctx: RunContext, delay: float, error: str, transition: Transition,
    rules: AttemptRules, *, refund: bool,
) -> None:  # fmt: skip
    def write() -> PendingMessage | None:
        with autocommit(ctx.engine) as conn:
            return journal.requeue(
                conn, ctx.spec, ctx.row, delay=timedelta(seconds=delay), error=error,
                transition=transition, actor=ctx.worker, refund=refund,
            )  # fmt: skip

    message = _persistently(write)
    if message is None:
        log.warning("job %s attempt %s: requeue refused, lease lost", ctx.job_id, ctx.attempt)
        return
    log.info("job %s %s in %.1fs: %s", ctx.job_id, transition.value, delay, error)
    # Short delays ride a countdown; long ones wait in the outbox for the relay.
    if delay <= rules.inline_wait_max:
        outbox.publish_now(app, [journal.on_local_clock(message, timedelta(seconds=delay))])
