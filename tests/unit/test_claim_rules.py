"""Why a guarded claim matched nothing: claim.explain(), a pure function of the row."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobsapp.lifecycle.journal import Run
from jobsapp.lifecycle.journal.key_slots import PARKED
from jobsapp.lifecycle.rules.states import State
from jobsapp.lifecycle.worker.claim import (
    LostClaim,
    Refusal,
    claim_lost,
    explain,
    foreign_refusal,
    is_expired,
    seconds_early,
)
from tests.support.runs import a_run

LATER = datetime(2025, 3, 1, 12, 10, tzinfo=UTC)  # a next_retry_at still ahead

counts = st.integers(min_value=0, max_value=10_000)
message_attempts = st.integers(min_value=1, max_value=10_001)


def row(
    state: State | str, attempts: int, next_retry_at: datetime | None = None, **more: Any
) -> Run:
    state = state.value if isinstance(state, State) else state
    return a_run(state=state, attempts=attempts, next_retry_at=next_retry_at, **more)


@given(attempt=message_attempts)
def test_no_row(attempt: int) -> None:
    assert explain(None, attempt) is Refusal.NO_ROW


@pytest.mark.parametrize("state", [State.SUCCEEDED, State.FAILED])
@given(attempts=counts, attempt=message_attempts)
def test_terminal_wins_over_every_attempt_number(state: State, attempts: int, attempt: int) -> None:
    """Every attempt of a terminal job is refused as terminal; which one tells Flower how
    the attempt itself ended: the one that ended the job, one requeued before, or one
    that never started."""
    refusal = explain(row(state, attempts), attempt)
    if attempt < attempts:
        assert refusal is Refusal.REQUEUED
    elif attempt == attempts:
        assert refusal is Refusal.TERMINAL
    else:
        assert refusal is Refusal.UNSTARTED
    assert refusal.value.startswith(Refusal.TERMINAL.value)


def test_terminal_state_as_enum_or_text() -> None:
    assert explain(a_run(state=State.FAILED, attempts=2), 2) is Refusal.TERMINAL
    assert explain(a_run(state="succeeded", attempts=2), 2) is Refusal.TERMINAL


def test_the_last_attempt_of_a_run_that_ended_queued_was_requeued() -> None:
    """A cancel or an expiry of a queued run ends the job after its last attempt's requeue;
    a cancel its worker or the reaper honoured (a request came first) ended that attempt."""
    cancelled_queued = row(State.FAILED, 2, outcome="cancelled")
    assert explain(cancelled_queued, 2) is Refusal.REQUEUED
    assert explain(cancelled_queued, 3) is Refusal.UNSTARTED
    stopped = row(State.FAILED, 2, outcome="cancelled", cancel_requested_at=LATER)
    assert explain(stopped, 2) is Refusal.TERMINAL
    expired = row(State.FAILED, 2, outcome="expired")
    assert explain(expired, 2) is Refusal.REQUEUED
    assert explain(expired, 3) is Refusal.EXPIRED
    assert explain(row(State.FAILED, 0, outcome="cancelled"), 1) is Refusal.UNSTARTED


@pytest.mark.parametrize("state", [State.QUEUED, State.RUNNING])
@given(attempts=st.integers(min_value=2, max_value=10_000), data=st.data())
def test_an_attempt_behind_the_row_is_stale(state: State, attempts: int, data: Any) -> None:
    attempt = data.draw(st.integers(min_value=1, max_value=attempts - 1))
    assert explain(row(state, attempts), attempt) is Refusal.STALE_ATTEMPT


@given(attempts=st.integers(min_value=1, max_value=10_000))
def test_the_running_attempt_is_in_flight(attempts: int) -> None:
    assert explain(row(State.RUNNING, attempts), attempts) is Refusal.IN_FLIGHT


def test_a_redelivered_attempt_of_a_requeued_row_is_stale() -> None:
    assert explain(row(State.QUEUED, 2, LATER), 2) is Refusal.STALE_ATTEMPT


@pytest.mark.parametrize("state", [State.QUEUED, State.RUNNING])
@given(attempts=counts, ahead=st.integers(min_value=2, max_value=1000))
def test_an_attempt_the_journal_never_scheduled_is_ahead(
    state: State, attempts: int, ahead: int
) -> None:
    assert explain(row(state, attempts), attempts + ahead) is Refusal.AHEAD


@given(attempts=counts)
def test_the_next_attempt_before_it_is_due_is_early(attempts: int) -> None:
    assert explain(row(State.QUEUED, attempts, LATER), attempts + 1) is Refusal.EARLY


def test_a_fresh_queued_row_and_first_message_is_early_when_not_due() -> None:
    assert explain(row(State.QUEUED, 0, LATER), 1) is Refusal.EARLY


@given(attempts=counts)
def test_a_run_waiting_for_a_slot_of_its_limited_key_is_not_merely_early(attempts: int) -> None:
    """An eager ``apply()`` must not sleep until a parked run's 9999-01-01."""
    assert explain(row(State.QUEUED, attempts, PARKED), attempts + 1) is Refusal.WAITING


@given(
    state=st.sampled_from([State.QUEUED, State.RUNNING]),
    attempts=counts,
    attempt=message_attempts,
)
def test_explain_agrees_with_the_rules(state: State, attempts: int, attempt: int) -> None:
    """One reference classification over the whole input space (cases the contract leaves
    open, a queued row with attempt == attempts and a running row with the next attempt,
    are left out)."""
    if attempt == attempts and state is State.QUEUED:
        return
    if attempt == attempts + 1 and state is State.RUNNING:
        return
    if attempt < attempts:
        expected = Refusal.STALE_ATTEMPT
    elif attempt == attempts:
        expected = Refusal.IN_FLIGHT
    elif attempt > attempts + 1:
        expected = Refusal.AHEAD
    else:
        expected = Refusal.EARLY
    assert explain(row(state, attempts, LATER), attempt) is expected


def test_every_refusal_but_skipped_and_expired_comes_from_explain() -> None:
    seen = {
        explain(None, 1),
        explain(row(State.FAILED, 1), 1),
        explain(row(State.FAILED, 2), 1),
        explain(row(State.FAILED, 1), 2),
        explain(row(State.FAILED, 1, outcome="expired"), 2),
        explain(row(State.RUNNING, 3), 2),
        explain(row(State.RUNNING, 3), 3),
        explain(row(State.QUEUED, 3, LATER), 4),
        explain(row(State.QUEUED, 3, PARKED), 4),
        explain(row(State.QUEUED, 3), 5),
    }
    # EXPIRED also before explain, by is_expired (the claim refused an expired row);
    # PAUSED and THROTTLED by flow control, after a claim that matched (rolled back).
    flow = {Refusal.PAUSED, Refusal.THROTTLED}
    assert seen == set(Refusal) - {Refusal.SKIPPED} - flow


def test_only_a_queued_row_past_its_expiry_is_expired() -> None:
    now = LATER
    past, future = now - timedelta(seconds=1), now + timedelta(seconds=1)
    assert is_expired(row(State.QUEUED, 0, expires_at=past), now)
    assert is_expired(row(State.QUEUED, 2, expires_at=now), now)
    assert not is_expired(row(State.QUEUED, 0, expires_at=future), now)
    assert not is_expired(row(State.QUEUED, 0, expires_at=None), now)
    assert not is_expired(row(State.RUNNING, 1, expires_at=past), now)
    assert not is_expired(row(State.FAILED, 1, expires_at=past), now)
    assert not is_expired(None, now)


def test_refusals_read_as_reasons() -> None:
    for refusal in Refusal:
        assert len(refusal.value.split()) >= 4, refusal.name
    assert len({r.value for r in Refusal}) == len(Refusal)


def test_an_early_message_knows_how_early_it_came_on_the_databases_clock() -> None:
    due = row(State.QUEUED, 1, LATER)
    assert seconds_early(due, LATER - timedelta(seconds=1.5)) == 1.5
    assert seconds_early(due, LATER + timedelta(seconds=3)) == 0.0
    assert seconds_early(row(State.QUEUED, 1), LATER) == 0.0


@given(attempt=message_attempts)
def test_a_foreign_message_starts_only_attempt_one(attempt: int) -> None:
    # The rule for a row with no attempt yet: attempt 7 of a 3-attempt task is never run.
    assert foreign_refusal(attempt) == (None if attempt == 1 else Refusal.AHEAD)
    assert foreign_refusal(attempt) == (
        None if attempt == 1 else explain(row(State.QUEUED, 0), attempt)
    )


MINE = uuid.UUID(int=1)
OTHER = uuid.UUID(int=2)


def claimed(state: State, attempts: int, token: uuid.UUID | None) -> Run:
    return row(state, attempts, claim_token=token)


@given(attempt=message_attempts)
def test_a_claim_lost_in_a_crash_leaves_the_run_queued_before_its_attempt(attempt: int) -> None:
    assert (
        claim_lost(claimed(State.QUEUED, attempt - 1, None), attempt, MINE) is LostClaim.UNCLAIMED
    )
    # The reaper's requeue keeps the taken attempt and its token; a later claim moved on.
    assert claim_lost(claimed(State.QUEUED, attempt, MINE), attempt, MINE) is None
    assert claim_lost(claimed(State.RUNNING, attempt + 1, OTHER), attempt, MINE) is None
    assert claim_lost(claimed(State.RUNNING, attempt, MINE), attempt, MINE) is None
    assert claim_lost(claimed(State.SUCCEEDED, attempt, MINE), attempt, MINE) is None
    assert claim_lost(None, attempt, MINE) is None


@given(attempt=message_attempts, state=st.sampled_from(State))
def test_a_lost_claim_whose_attempt_was_claimed_again_is_told_by_its_token(
    attempt: int, state: State
) -> None:
    # Only a second claim of the same attempt carries its number under another token,
    # whatever that claim did since.
    assert claim_lost(claimed(state, attempt, OTHER), attempt, MINE) is LostClaim.RECLAIMED
