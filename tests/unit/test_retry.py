"""Retry decisions: backoff shape, the failure verdicts, inline waits, policy validation."""

from __future__ import annotations

import math

import pytest
from celery.exceptions import Ignore, Reject
from hypothesis import given, settings
from hypothesis import strategies as st

from jobsapp.lifecycle.rules.errors import (
    PermanentError,
    RetryAfter,
    RetryRequested,
    TransientError,
)
from jobsapp.lifecycle.rules.retry import (
    Action,
    Decision,
    RetryPolicy,
    backoff,
    decide_failure,
    decide_retry_after,
)
from jobsapp.lifecycle.rules.states import Outcome

NO_JITTER = RetryPolicy(base_delay=2.0, max_delay=3600.0, jitter=0.0)
MID = 0.5  # rand = 0.5 is the centre of the jitter band: no spread

attempts = st.integers(min_value=1, max_value=60)
rands = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)
policies = st.builds(
    lambda base, factor, jitter: RetryPolicy(base, base * factor, jitter),
    st.floats(min_value=0.0, max_value=100.0),
    st.floats(min_value=1.0, max_value=10_000.0),
    st.floats(min_value=0.0, max_value=0.99),
)


# --- backoff --------------------------------------------------------------------------------


def test_backoff_doubles_from_the_base() -> None:
    assert [backoff(NO_JITTER, a, MID) for a in range(1, 6)] == [2.0, 4.0, 8.0, 16.0, 32.0]


def test_backoff_is_capped_by_max_delay() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=10.0, jitter=0.0)
    assert [backoff(policy, a, MID) for a in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_attempt_zero_or_below_is_treated_as_the_first() -> None:
    assert backoff(NO_JITTER, 0, MID) == backoff(NO_JITTER, 1, MID) == 2.0


@settings(max_examples=200)
@given(policy=policies, attempt=attempts)
def test_backoff_grows_exponentially_until_the_cap(policy: RetryPolicy, attempt: int) -> None:
    flat = RetryPolicy(policy.base_delay, policy.max_delay, 0.0)
    here, after = backoff(flat, attempt, MID), backoff(flat, attempt + 1, MID)
    assert here <= after <= policy.max_delay
    expected = min(policy.max_delay, policy.base_delay * 2 ** (attempt - 1))
    assert math.isclose(here, expected, rel_tol=1e-9, abs_tol=1e-12)
    if 2 * here <= policy.max_delay:
        assert math.isclose(after, 2 * here, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=300)
@given(policy=policies, attempt=attempts, rand=rands)
def test_jitter_stays_within_its_fraction_and_under_the_cap(
    policy: RetryPolicy, attempt: int, rand: float
) -> None:
    raw = min(policy.max_delay, policy.base_delay * 2 ** (attempt - 1))
    delay = backoff(policy, attempt, rand)
    slack = 1e-9 * max(1.0, raw)
    assert 0.0 <= delay <= policy.max_delay
    assert raw * (1 - policy.jitter) - slack <= delay <= raw * (1 + policy.jitter) + slack


@given(attempt=attempts, low=rands, high=rands)
def test_jitter_is_monotonic_in_rand(attempt: int, low: float, high: float) -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=1e9, jitter=0.3)
    low, high = sorted((low, high))
    assert backoff(policy, attempt, low) <= backoff(policy, attempt, high)


def test_jitter_spreads_both_ways_below_the_cap() -> None:
    policy = RetryPolicy(base_delay=10.0, max_delay=1000.0, jitter=0.2)
    assert backoff(policy, 1, 0.0) == pytest.approx(8.0)
    assert backoff(policy, 1, 0.5) == pytest.approx(10.0)
    assert backoff(policy, 1, 0.999999) == pytest.approx(12.0, rel=1e-5)


def test_backoff_survives_a_huge_attempt_number() -> None:
    assert backoff(RetryPolicy(), 1100, MID) == 3600.0


# --- decide_failure -------------------------------------------------------------------------


class QuotaGone(Exception):
    """A domain error the task declares permanent."""


def decide(exc: BaseException, attempt: int = 1, max_attempts: int = 5, **kw: object) -> Decision:
    return decide_failure(
        exc, attempt=attempt, max_attempts=max_attempts, policy=NO_JITTER, rand=MID, **kw
    )  # type: ignore[arg-type]


@pytest.mark.parametrize("attempt", [1, 3, 5])
def test_permanent_error_fails_permanent_on_any_attempt(attempt: int) -> None:
    decision = decide(PermanentError("bad input", error_code="bad"), attempt=attempt)
    assert decision == Decision(Action.FAIL, outcome=Outcome.PERMANENT)


def test_a_listed_permanent_type_fails_permanent() -> None:
    decision = decide(QuotaGone("no"), permanent=(QuotaGone,))
    assert decision.action is Action.FAIL
    assert decision.outcome is Outcome.PERMANENT


def test_subclasses_of_a_listed_permanent_type_count() -> None:
    class Narrower(QuotaGone):
        pass

    assert decide(Narrower(), permanent=(QuotaGone,)).outcome is Outcome.PERMANENT


def test_an_unlisted_type_is_retried() -> None:
    assert decide(QuotaGone("no")).action is Action.RETRY


def test_celerys_ignore_and_reject_end_the_task_and_a_requeued_reject_is_retried() -> None:
    # Celery never runs a task again that raised Ignore or Reject(requeue=False).
    for done in (Ignore(), Reject("no thanks", requeue=False)):
        assert decide(done) == Decision(Action.FAIL, outcome=Outcome.PERMANENT)
    assert decide(Reject("later", requeue=True)).action is Action.RETRY


@pytest.mark.parametrize(
    "exc", [TransientError("down"), ValueError("x"), RetryAfter(10), QuotaGone()]
)
def test_the_last_attempt_fails_exhausted(exc: BaseException) -> None:
    assert decide(exc, attempt=5, max_attempts=5) == Decision(
        Action.FAIL, outcome=Outcome.EXHAUSTED
    )


def test_past_the_last_attempt_also_fails_exhausted() -> None:
    assert decide(TransientError(), attempt=7, max_attempts=5).outcome is Outcome.EXHAUSTED


def test_permanent_wins_over_exhausted() -> None:
    assert decide(PermanentError("x"), attempt=5, max_attempts=5).outcome is Outcome.PERMANENT


@pytest.mark.parametrize("seconds", [0, 0.5, 30, 7200])
def test_retry_after_retries_with_its_seconds(seconds: float) -> None:
    decision = decide(RetryAfter(seconds), attempt=2)
    assert decision == Decision(Action.RETRY, delay=float(seconds))


def test_retry_after_negative_seconds_are_zero() -> None:
    assert decide(RetryAfter(-5)).delay == 0.0


@given(attempt=st.integers(min_value=1, max_value=30), rand=rands)
def test_other_errors_retry_with_the_backoff(attempt: int, rand: float) -> None:
    decision = decide_failure(
        TransientError("down"),
        attempt=attempt,
        max_attempts=31,
        policy=RetryPolicy(),
        rand=rand,
    )
    assert decision.action is Action.RETRY
    assert decision.outcome is None
    assert decision.delay == backoff(RetryPolicy(), attempt, rand)


def test_without_rand_the_delay_is_still_in_the_jitter_band() -> None:
    policy = RetryPolicy(base_delay=10.0, max_delay=1000.0, jitter=0.2)
    for _ in range(50):
        decision = decide_failure(ValueError(), attempt=1, max_attempts=3, policy=policy)
        assert 8.0 <= decision.delay <= 12.0


# --- decide_retry_after ---------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [0.0, 1.0, 5.0])
def test_short_pauses_wait_inline(seconds: float) -> None:
    assert decide_retry_after(seconds, 5.0) == Decision(Action.WAIT_INLINE, delay=seconds)


@pytest.mark.parametrize("seconds", [5.001, 60.0, 86_400.0])
def test_long_pauses_snooze(seconds: float) -> None:
    assert decide_retry_after(seconds, 5.0) == Decision(Action.SNOOZE, delay=seconds)


@given(seconds=st.floats(min_value=0, max_value=1e6), limit=st.floats(min_value=0, max_value=1e6))
def test_retry_after_boundary(seconds: float, limit: float) -> None:
    decision = decide_retry_after(seconds, limit)
    assert decision.delay == seconds
    assert decision.outcome is None
    assert decision.action is (Action.WAIT_INLINE if seconds <= limit else Action.SNOOZE)


# --- RetryPolicy ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_delay": -1.0},
        {"base_delay": 10.0, "max_delay": 5.0},
        {"max_delay": -1.0},
        {"jitter": -0.1},
        {"jitter": 1.0},
        {"jitter": 1.5},
        {"jitter": math.nan},
    ],
)
def test_policy_rejects_invalid_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="retry"):
        RetryPolicy(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"base_delay": 0.0, "max_delay": 0.0},
        {"base_delay": 5.0, "max_delay": 5.0},
        {"jitter": 0.0},
        {"jitter": 0.99},
    ],
)
def test_policy_accepts_edge_values(kwargs: dict[str, float]) -> None:
    RetryPolicy(**kwargs)


def test_policy_defaults_and_immutability() -> None:
    policy = RetryPolicy()
    assert (policy.base_delay, policy.max_delay, policy.jitter) == (2.0, 3600.0, 0.2)
    with pytest.raises(AttributeError):
        policy.jitter = 0.5  # type: ignore[misc]


# Celery's habits (issue 36): autoretry_for lists the only exceptions that retry, and
# self.retry(max_retries=n) bounds that call's retries.


def test_with_autoretry_for_an_exception_it_does_not_list_fails_at_once() -> None:
    decided = decide_failure(
        ValueError("x"), attempt=1, max_attempts=5, policy=RetryPolicy(), requested_only=True
    )
    assert decided == Decision(Action.FAIL, outcome=Outcome.PERMANENT)


@pytest.mark.parametrize("exc", [RetryRequested(ConnectionError("down"), None), RetryAfter(3)])
def test_with_autoretry_for_what_the_task_asked_to_retry_retries(exc: Exception) -> None:
    decided = decide_failure(
        exc, attempt=1, max_attempts=5, policy=RetryPolicy(), requested_only=True, rand=0.5
    )
    assert decided.action is Action.RETRY


@pytest.mark.parametrize(("attempt", "action"), [(1, Action.RETRY), (2, Action.FAIL)])
def test_a_retry_calls_own_max_retries_bounds_it(attempt: int, action: Action) -> None:
    asked = RetryRequested(None, None, max_retries=1)
    decided = decide_failure(
        asked, attempt=attempt, max_attempts=10, policy=RetryPolicy(), rand=0.5
    )
    assert decided.action is action
    assert decided.outcome in (None, Outcome.EXHAUSTED)
