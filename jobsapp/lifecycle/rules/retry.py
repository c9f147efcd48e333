"""Retry decisions: pure functions of the policy, the attempt and the error."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from enum import StrEnum

from celery.exceptions import Ignore, Reject

from jobsapp.lifecycle.rules.errors import PermanentError, RetryAfter, RetryRequested
from jobsapp.lifecycle.rules.states import Outcome

# jobsapp's own call checks live in the engine: a TypeError raised in jobsapp/lifecycle/
# refuses a call.
_LIFECYCLE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "")


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter: ``base * 2**(attempt-1)``, capped, +-``jitter``."""

    base_delay: float = 2.0
    max_delay: float = 3600.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.base_delay < 0 or self.max_delay < self.base_delay:
            raise ValueError("retry policy needs 0 <= base_delay <= max_delay")
        if not 0 <= self.jitter < 1:
            raise ValueError("retry jitter is a fraction in [0, 1)")


class Action(StrEnum):
    RETRY = "retry"
    FAIL = "fail"
    WAIT_INLINE = "wait_inline"
    SNOOZE = "snooze"


@dataclass(frozen=True)
class Decision:
    action: Action
    delay: float = 0.0
    outcome: Outcome | None = None


def backoff(policy: RetryPolicy, attempt: int, rand: float) -> float:
    """Delay before the attempt after ``attempt``; ``rand`` in [0, 1) spreads the herd."""
    # The exponent is capped: a huge attempt number must not overflow the float.
    raw = min(policy.max_delay, policy.base_delay * 2.0 ** min(max(0, attempt - 1), 64))
    spread = raw * policy.jitter * (2 * rand - 1)
    return max(0.0, min(policy.max_delay, raw + spread))


def decide_retry_after(seconds: float, inline_wait_max: float) -> Decision:
    """Short pauses are slept with the heartbeat running; long ones free the slot."""
    if seconds <= inline_wait_max:
        return Decision(Action.WAIT_INLINE, delay=seconds)
    return Decision(Action.SNOOZE, delay=seconds)


def is_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` is jobsapp refusing a call the body made (an option it does not
    support, arguments that are not JSON, ``replace()``): a ``TypeError`` raised by the
    lifecycle package's own checks. A mistake in the code, not a passing fault: the same
    call would be refused again, so it is never retried, not even through a
    ``self.retry(exc=...)`` (``autoretry_for=(Exception,)``)."""
    if isinstance(exc, RetryRequested) and exc.cause is not None:
        exc = exc.cause
    if not isinstance(exc, TypeError):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.startswith(_LIFECYCLE)


def _ends_task(exc: BaseException) -> bool:
    """Celery's ``Ignore`` and ``Reject(requeue=False)``: the body says the task is done
    with; Celery never runs it again."""
    return isinstance(exc, Ignore) or (
        isinstance(exc, Reject) and not getattr(exc, "requeue", False)
    )


def decide_failure(
    exc: BaseException,
    *,
    attempt: int,
    max_attempts: int,
    policy: RetryPolicy,
    permanent: tuple[type[BaseException], ...] = (),
    rand: float | None = None,
    requested_only: bool = False,
) -> Decision:
    """What to do after the body raised ``exc`` on ``attempt`` (1-based).

    A ``PermanentError``, one of the task's ``permanent`` errors, a refusal of a call
    (``is_refusal``), or Celery's ``Ignore`` or ``Reject(requeue=False)`` fails at once.

    ``requested_only`` (a task that declares Celery's ``autoretry_for``): only what the
    task asked to retry is retried (``self.retry()``, which ``autoretry_for`` calls for
    the exceptions it lists, or a ``RetryAfter``); any other exception fails at once, as
    in Celery. A ``self.retry(max_retries=n)`` is exhausted after ``n`` retries."""
    if isinstance(exc, (PermanentError, *permanent)) or is_refusal(exc) or _ends_task(exc):
        return Decision(Action.FAIL, outcome=Outcome.PERMANENT)
    if requested_only and not isinstance(exc, RetryRequested | RetryAfter):
        return Decision(Action.FAIL, outcome=Outcome.PERMANENT)
    retries_left = not (
        isinstance(exc, RetryRequested)
        and exc.max_retries is not None
        and attempt - 1 >= exc.max_retries
    )
    if attempt >= max_attempts or not retries_left:
        return Decision(Action.FAIL, outcome=Outcome.EXHAUSTED)
    if isinstance(exc, RetryAfter):
        return Decision(Action.RETRY, delay=exc.seconds)
    draw = random.random() if rand is None else rand
    return Decision(Action.RETRY, delay=backoff(policy, attempt, draw))
