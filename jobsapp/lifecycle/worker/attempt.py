"""One claimed attempt: heartbeat, body (with short Retry-After waits), outcome mapping."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from enum import StrEnum
from functools import partial
from typing import Any, TypeVar

from celery import Celery
from celery.exceptions import MaxRetriesExceededError, TimeLimitExceeded
from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError

from jobsapp import crashpoints
from jobsapp.db import autocommit, relaxed_autocommit, relaxed_transaction
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import PendingMessage, Run
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules import results
from jobsapp.lifecycle.rules.errors import LeaseLost, Replaced, RetryAfter, RetryRequested
from jobsapp.lifecycle.rules.failures import cause_of, describe, failure_detail
from jobsapp.lifecycle.rules.retry import Action, RetryPolicy, decide_failure, decide_retry_after
from jobsapp.lifecycle.rules.scrub import describe_exception
from jobsapp.lifecycle.rules.states import Outcome, Transition
from jobsapp.lifecycle.transport import outbox
from jobsapp.lifecycle.worker import key_limits
from jobsapp.lifecycle.worker.context import RunContext
from jobsapp.settings import get_settings

log = logging.getLogger(__name__)

T = TypeVar("T")
# Pauses between attempts to write an outcome while the database is unreachable.
OUTCOME_WRITE_PAUSES = (0.5, 1.0, 2.0, 4.0)
# A body that keeps asking for short pauses is snoozed after this many inline waits.
MAX_INLINE_WAITS = 3


class End(StrEnum):
    """How an attempt ended, as its Celery task reports it (Flower's view of the journal)."""

    SUCCEEDED = "succeeded"
    REQUEUED = "requeued"
    FAILED = "failed"
    LEASE_LOST = "lease lost"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Ended:
    end: End
    # The scrubbed error of a failed attempt, or what happened instead of an outcome.
    summary: str = ""
    # What the body returned (succeeded), or the exception it raised (requeued, failed):
    # the Celery task shows them (eager ``apply()``, Flower).
    value: Any = None
    error: BaseException | None = None


@dataclass(frozen=True)
class AttemptRules:
    policy: RetryPolicy
    permanent: tuple[type[BaseException], ...]
    inline_wait_max: float
    secrets: tuple[str, ...]
    # Long Retry-After pauses a job may take before it fails with ``snooze_limit``.
    max_snoozes: int = 10
    # The task declares Celery's ``autoretry_for``: only what it asks to retry is retried.
    requested_only: bool = False
    # False when the caller runs the next attempt itself (eager ``apply()``): a requeue
    # leaves its message to the relay instead of handing it to a worker now.
    publish_retry: bool = True
    # The largest return value the run keeps (JOBSAPP_RESULT_MAX_BYTES).
    result_max_bytes: int = field(default_factory=lambda: get_settings().result_max_bytes)
    # False (JOBSAPP_FINISH_FLUSH=no-wait): the success commits without waiting for the
    # WAL flush; failures and requeues always wait (docs/lifecycle.md).
    success_waits_for_flush: bool = field(
        default_factory=lambda: get_settings().success_waits_for_flush
    )


def run_attempt(
    app: Celery, ctx: RunContext, body: Callable[[], Any], rules: AttemptRules
) -> Ended:
    """Run the body under the heartbeat, then write the one outcome it earned; a write
    refused because a revoke asked the attempt to stop ends it cancelled instead."""
    ended = _attempt(app, ctx, body, rules)
    if ended.end is End.LEASE_LOST:
        ended = _honour_cancel(app, ctx, ended)
    if ctx.row.key_limit is not None:  # only a limited key's run enters key_limits
        key_limits.publish_granted(app, ctx.granted)
    return ended


def _honour_cancel(app: Celery, ctx: RunContext, lost: Ended) -> Ended:
    """After a refused write (one statement more, on that path only): a cancel request
    ends the attempt cancelled; anything else left the lease lost."""
    if not honour_cancel(app, ctx):
        return lost
    log.warning(
        "job %s attempt %s: cancelled by a revoke; nothing published", ctx.job_id, ctx.attempt
    )
    return Ended(End.CANCELLED, "cancelled by a revoke; nothing published")


def honour_cancel(app: Celery, ctx: RunContext) -> bool:
    """End the attempt cancelled if a revoke asked it to stop (under its claim's fence); a
    workflow step's end publishes what it started (a chord's body's errbacks)."""
    done, started = _persistently(lambda: _end(ctx, ctx.engine.begin, journal.honour_cancel))
    if done:
        _publish_started(app, started)
    return done


def _attempt(app: Celery, ctx: RunContext, body: Callable[[], Any], rules: AttemptRules) -> Ended:
    with ctx.heartbeat, ctx:
        try:
            value = _call_with_waits(ctx, body, rules)
            if not ctx.finished:
                kept = results.checked(ctx.row.task_name, value, rules.result_max_bytes)
        except LeaseLost as lost:
            log.warning("%s; nothing published", lost)
            return Ended(End.LEASE_LOST, f"{lost}; nothing published")
        except RetryAfter as pause:
            return _snooze(app, ctx, pause, rules)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a journal outcome
            return _settle_failure(app, ctx, exc, rules)
    if ctx.failed_with is not None:
        return _failed_by_the_body(ctx, ctx.failed_with, rules)
    if ctx.finished:
        return Ended(End.SUCCEEDED, "finished by the body", value=value)
    waits = success_waits_for_flush(ctx.spec, ctx.row, rules.success_waits_for_flush)
    return _succeed(app, ctx, value, kept, flushed=waits)


def _failed_by_the_body(ctx: RunContext, error: BaseException, rules: AttemptRules) -> Ended:
    """The body ended its run failed (``RunContext.failing``): the journal has it; Celery
    and Flower get FAILURE with the body's exception, and the log its one error line."""
    said = describe(error, rules.secrets)
    log.error("job %s failed at attempt %s: %s", ctx.job_id, ctx.attempt, said, exc_info=error)
    return Ended(End.FAILED, f"failed by the body: {said}", error=cause_of(error))


def _call_with_waits(ctx: RunContext, body: Callable[[], Any], rules: AttemptRules) -> Any:
    waits = 0
    while True:
        try:
            crashpoints.hit("mid_run")
            with ctx.heartbeat.interruptible():
                return body()
        except Replaced:
            return None  # the run succeeded with the hand-over (lifecycle/workflows/replacement.py)
        except RetryAfter as pause:
            decision = decide_retry_after(pause.seconds, rules.inline_wait_max)
            waits += 1
            if decision.action is not Action.WAIT_INLINE or waits > MAX_INLINE_WAITS:
                raise
            log.info("job %s waits %.1fs inline: %s", ctx.job_id, pause.seconds, pause)
            ctx.heartbeat.wait(pause.seconds)


def success_waits_for_flush(spec: RunTable, row: Run, setting: bool) -> bool:
    """Whether the success of the claimed ``row`` waits for its WAL flush: as ``setting``
    (JOBSAPP_FINISH_FLUSH) says, and always where a crash that lost the success would not
    run the job again: the claim surviving it leaves the run ``running``, and the reaper
    fails a stale run with no attempt or rescue to spare (``failed/stale``, although the
    body succeeded). docs/lifecycle.md, "A success may not wait for the flush"."""
    return setting or not spec.requeues_stale(row.attempts, row.max_attempts, row.rescues)


def _succeed(app: Celery, ctx: RunContext, value: Any, kept: Any, *, flushed: bool) -> Ended:
    """The run succeeds with ``kept`` (``value`` as the journal keeps it: results.checked);
    the attempt's Celery result is ``value`` itself."""

    children = ctx.children if ctx.callbacks is None else [*(ctx.children or ()), *ctx.callbacks]
    keeps = None if children is None else partial(_keep_children, ctx, children)

    def write() -> tuple[bool, list[PendingMessage]]:
        connection = partial(_outcome_connection, ctx, flushed=flushed, more=keeps is not None)
        return _end(
            ctx, connection, journal.succeed, keeps, result=kept, chain_ended=ctx.chain_ended
        )

    done, started = _persistently(write)
    if done:
        _publish_started(app, started)
        return Ended(End.SUCCEEDED, value=value)
    log.warning("job %s attempt %s: finish refused, lease lost", ctx.job_id, ctx.attempt)
    return Ended(End.LEASE_LOST, "finish refused, lease lost")


def _outcome_connection(
    ctx: RunContext, *, flushed: bool = True, more: bool = False
) -> AbstractContextManager[Connection]:
    """One statement for a job of its own; a workflow step's end also writes the steps it
    starts (journal/workflow.py), a limited run's frees its key's slot, and a success whose
    body called tasks (``more``) keeps their results, in the same transaction. Not
    ``flushed``: the commit does not wait for the WAL flush; a crash that loses it loses
    the whole outcome, and the run repeats (docs/lifecycle.md)."""
    shared = more or ctx.row.workflow_id is not None or ctx.row.key_limit is not None
    if flushed:
        return ctx.engine.begin() if shared else autocommit(ctx.engine)
    return relaxed_transaction(ctx.engine) if shared else relaxed_autocommit(ctx.engine)


def _publish_started(app: Celery, started: list[PendingMessage]) -> None:
    """The fast path for the steps a workflow step's end started (the relay otherwise)."""
    if started:
        crashpoints.hit("step_after_commit_before_successors")
        outbox.publish_started(app, started)


def _end(
    ctx: RunContext,
    connection: Callable[[], AbstractContextManager[Connection]],
    end: Callable[..., bool],
    first: Callable[[Connection], None] | None = None,
    **given: Any,
) -> tuple[bool, list[PendingMessage]]:
    """One fenced end of the attempt (``end``: journal.succeed, fail or honour_cancel, told
    ``given``; ``first`` written before it) and its key's release, in one transaction; with
    what a workflow step's end started, to publish after COMMIT."""
    started: list[PendingMessage] = []
    with connection() as conn:
        if first is not None:
            first(conn)
        done = end(
            conn,
            ctx.spec,
            ctx.job_id,
            ctx.attempt,
            token=ctx.token,
            actor=ctx.worker,
            started=started,
            **given,
        )
        return _let_go(conn, ctx, done), started


def _keep_children(ctx: RunContext, children: list[Any], conn: Connection) -> None:
    """The results of the calls the body made (Celery's ``children``), kept under the
    attempt's fence before its success, in its transaction."""
    journal.keep_children(conn, ctx.spec, ctx.row, ctx.token, [r.as_tuple() for r in children])


def _let_go(conn: Connection, ctx: RunContext, written: bool) -> bool:
    """A limited run's outcome frees its key's slot in the same transaction."""
    if ctx.row.key_limit is None:
        return written
    done, ctx.granted = key_limits.let_go(conn, ctx.spec, ctx.row, written)
    return done


def _persistently(write: Callable[[], T]) -> T:
    """An outcome write survives a short database outage; past that the reaper decides."""
    for pause in OUTCOME_WRITE_PAUSES:
        try:
            return write()
        except OperationalError as down:
            log.warning(
                "outcome write failed (%s); again in %.0fs", type(down.orig).__name__, pause
            )
            time.sleep(pause)
    return write()


def _describe(exc: BaseException, rules: AttemptRules) -> str:
    return describe(exc, rules.secrets)


def _settle_failure(app: Celery, ctx: RunContext, exc: Exception, rules: AttemptRules) -> Ended:
    decision = decide_failure(
        exc,
        attempt=ctx.attempt,
        max_attempts=ctx.row.max_attempts,
        policy=rules.policy,
        permanent=rules.permanent,
        requested_only=rules.requested_only,
    )
    delay = decision.delay
    if isinstance(exc, RetryRequested) and exc.countdown is not None:
        delay = exc.countdown
    if decision.action is Action.FAIL and isinstance(exc, RetryRequested) and not exc.cause:
        exc = RetryRequested(_max_retries_exceeded(ctx), None)
    error = _describe(exc, rules)
    detail = failure_detail(exc, rules.secrets)
    cause = cause_of(exc)
    if decision.action is Action.FAIL:
        assert decision.outcome is not None
        ended = _fail(app, ctx, decision.outcome, error, detail, cause)
    else:
        ended = _requeue(
            app,
            ctx,
            delay,
            error,
            Transition.RETRY,
            rules,
            refund=False,
            detail=detail,
            cause=cause,
        )
    return replace(ended, error=cause)


def time_out(app: Celery, ctx: RunContext, rules: AttemptRules, seconds: float) -> Ended:
    """End the attempt past its hard time limit as if its body had raised Celery's
    ``TimeLimitExceeded(seconds)``: recorded so, then retried or failed as the retry policy
    says. Written for a body that cannot write it (lifecycle/worker/timeouts.py)."""
    ended = _settle_failure(app, ctx, TimeLimitExceeded(seconds), rules)
    key_limits.publish_granted(app, ctx.granted)
    return ended


def _max_retries_exceeded(ctx: RunContext) -> MaxRetriesExceededError:
    """Celery's error for a ``self.retry()`` with no ``exc`` once no retry is left."""
    params = ctx.row.columns.get("params") or {}
    return MaxRetriesExceededError(
        f"Can't retry {ctx.row.task_name}[{ctx.job_id}] args:{tuple(params.get('args', ()))} "
        f"kwargs:{params.get('kwargs', {})}"
    )


def _fail(
    app: Celery,
    ctx: RunContext,
    outcome: Outcome,
    error: str,
    detail: dict[str, str],
    cause: BaseException | None = None,
) -> Ended:
    def write() -> tuple[bool, list[PendingMessage]]:
        connection = partial(_outcome_connection, ctx)
        return _end(ctx, connection, journal.fail, outcome=outcome, error=error, detail=detail)

    done, started = _persistently(write)
    if not done:
        log.warning("job %s attempt %s: failure refused, lease lost", ctx.job_id, ctx.attempt)
        return Ended(End.LEASE_LOST, f"failure refused, lease lost: {error}")
    _publish_started(app, started)
    # The body's own exception and traceback (scrubbed by the handlers' filter), for the
    # log line and for what reads exc_info (Sentry's logging integration, JSON fields).
    log.error(
        "job %s failed (%s) at attempt %s: %s",
        ctx.job_id,
        outcome,
        ctx.attempt,
        error,
        exc_info=cause,
    )
    return Ended(End.FAILED, f"{outcome}: {error}")


def _snooze(app: Celery, ctx: RunContext, pause: RetryAfter, rules: AttemptRules) -> Ended:
    reason = f"retry after {pause.seconds:g}s: {describe_exception(pause, secrets=rules.secrets)}"

    def taken() -> int:
        with ctx.engine.connect() as conn:
            return journal.snoozes(conn, ctx.spec, ctx.job_id)

    if _persistently(taken) >= rules.max_snoozes:
        gave_up = f"{reason}; gave up after {rules.max_snoozes} snoozes"
        return _fail(app, ctx, Outcome.SNOOZE_LIMIT, gave_up, failure_detail(pause, rules.secrets))
    return _requeue(app, ctx, pause.seconds, reason, Transition.SNOOZE, rules, refund=True)


def _requeue(
    app: Celery,
    ctx: RunContext,
    delay: float,
    error: str,
    transition: Transition,
    rules: AttemptRules,
    *,
    refund: bool,
    detail: dict[str, str] | None = None,
    cause: BaseException | None = None,
) -> Ended:
    def write() -> PendingMessage | None:
        with autocommit(ctx.engine) as conn:
            return journal.requeue(
                conn,
                ctx.spec,
                ctx.row,
                delay=timedelta(seconds=delay),
                error=error,
                transition=transition,
                actor=ctx.worker,
                refund=refund,
                detail=detail,
            )

    message = _persistently(write)
    if message is None:
        log.warning("job %s attempt %s: requeue refused, lease lost", ctx.job_id, ctx.attempt)
        return Ended(End.LEASE_LOST, f"requeue refused, lease lost: {error}")
    # A failed attempt is a warning; a snooze (the body asked to wait) is routine.
    level = logging.WARNING if transition is Transition.RETRY else logging.INFO
    log.log(
        level,
        "job %s attempt %s: %s in %.1fs: %s",
        ctx.job_id,
        ctx.attempt,
        transition.value,
        delay,
        error,
        exc_info=cause,
    )
    # Short delays ride a countdown; long ones wait in the outbox for the relay.
    if delay <= rules.inline_wait_max and rules.publish_retry:
        outbox.publish_now(app, [journal.on_local_clock(message, timedelta(seconds=delay))])
    return Ended(End.REQUEUED, error)
