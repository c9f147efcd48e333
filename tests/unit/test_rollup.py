"""What a page of journal events adds to the /metrics totals (pure)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from jobsapp.monitor.rollup import (
    ATTEMPTS,
    FAILURES,
    QUEUE_WAIT,
    REAPED,
    RUN_DURATION,
    SUM_MS,
    UNKNOWN_TASK,
    Event,
    bucket_label,
    by_minute,
    error_code,
    failures_by_minute,
    settled,
    tally,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
JOB = uuid.uuid4()


def event(n: int, transition: str, seconds: float, attempt: int = 1) -> Event:
    return Event(n, "jobs", JOB, attempt, transition, T0 + timedelta(seconds=seconds))


def test_an_attempt_counts_its_outcome_its_wait_and_its_duration() -> None:
    events = [event(1, "claim", 0.3), event(2, "succeed", 2.0)]
    totals = tally(events, {JOB: "t"}, {(JOB, 1): events[0].at}, {(JOB, 1): (T0, None)})
    assert totals == {
        (ATTEMPTS, "jobs", "t", "succeeded"): 1,
        (QUEUE_WAIT, "jobs", "t", "0.5"): 1,
        (QUEUE_WAIT, "jobs", "t", SUM_MS): 300,
        (RUN_DURATION, "jobs", "t", "2.5"): 1,
        (RUN_DURATION, "jobs", "t", SUM_MS): 1700,
    }


def test_a_cancel_counts_an_attempt_only_when_it_stops_a_running_one() -> None:
    stopped = Event(7, "jobs", JOB, 1, "cancel", T0 + timedelta(seconds=9), from_state="running")
    never_ran = Event(8, "jobs", JOB, 1, "cancel", T0, from_state="queued")
    totals = tally([stopped, never_ran], {JOB: "t"}, {(JOB, 1): T0}, {})
    # No duration: its end is when the revoke stopped it.
    assert totals == {(ATTEMPTS, "jobs", "t", "cancelled"): 1}


def test_a_reaped_run_counts_as_reaped_without_a_duration() -> None:
    totals = tally([event(5, "reap_requeue", 90.0)], {}, {(JOB, 1): T0}, {})
    assert totals == {
        (ATTEMPTS, "jobs", UNKNOWN_TASK, "reaped"): 1,
        (REAPED, "jobs", UNKNOWN_TASK, "requeued"): 1,
    }


def test_a_retry_then_a_failure_are_two_attempts_and_enqueues_count_nothing() -> None:
    events = [event(1, "enqueue", 0), event(2, "retry", 1), event(3, "fail", 2, attempt=2)]
    totals = tally(events, {JOB: "t"}, {}, {})
    assert totals == {(ATTEMPTS, "jobs", "t", "retried"): 1, (ATTEMPTS, "jobs", "t", "failed"): 1}


def test_a_wait_past_the_last_bucket_is_infinite_and_a_clock_skew_is_zero() -> None:
    assert bucket_label(4000.0) == "+Inf"
    assert bucket_label(0.0) == "0.05"
    early = tally([event(1, "claim", -1.0)], {}, {}, {(JOB, 1): (T0, None)})
    assert early[(QUEUE_WAIT, "jobs", UNKNOWN_TASK, SUM_MS)] == 0


def test_the_wait_runs_from_the_publish_unless_it_was_marked_after_the_claim() -> None:
    published = T0 + timedelta(seconds=60)
    waited = tally([event(1, "claim", 61.0)], {}, {}, {(JOB, 1): (T0, published)})
    assert waited[(QUEUE_WAIT, "jobs", UNKNOWN_TASK, SUM_MS)] == 1000
    marked_late = tally([event(1, "claim", 0.2)], {}, {}, {(JOB, 1): (T0, published)})
    assert marked_late[(QUEUE_WAIT, "jobs", UNKNOWN_TASK, SUM_MS)] == 200


def test_the_cursor_stops_before_the_first_event_too_young_to_be_sure_of() -> None:
    page = [event(1, "claim", 0), event(2, "claim", 20), event(3, "claim", 1)]
    assert [e.id for e in settled(page, T0 + timedelta(seconds=10))] == [1]


def test_a_series_counts_a_wait_in_its_claims_minute_and_a_duration_in_its_endings() -> None:
    events = [event(1, "claim", 59.0), event(2, "succeed", 62.0)]
    series = by_minute(events, {JOB: "t"}, {(JOB, 1): events[0].at}, {(JOB, 1): (T0, None)})
    claim_minute, end_minute = T0, T0 + timedelta(minutes=1)
    assert series == {
        (claim_minute, QUEUE_WAIT, "jobs", "t", "60"): 1,
        (end_minute, ATTEMPTS, "jobs", "t", "succeeded"): 1,
        (end_minute, RUN_DURATION, "jobs", "t", "5"): 1,
    }


def test_a_failure_s_code_is_its_exception_type_else_the_word_before_a_colon() -> None:
    assert error_code("whatever", {"type": "jobsapp.errors.PermanentError"}) == "PermanentError"
    assert error_code("storage_unavailable: S3 said 503", None) == "storage_unavailable"
    assert error_code("no colon here", {}) == "other"
    # The series' label holds 32 characters: a longer type is cut, not refused.
    assert error_code("", {"type": "x." + "A" * 40}) == "A" * 32


def test_failed_attempts_count_by_minute_task_and_code_and_nothing_else_does() -> None:
    failed = Event(1, "jobs", JOB, 1, "fail", T0 + timedelta(seconds=70), code="ValueError")
    retried = Event(2, "jobs", JOB, 2, "retry", T0 + timedelta(seconds=75), code="ValueError")
    claim = event(3, "claim", 80)
    minute = T0 + timedelta(minutes=1)
    assert failures_by_minute([failed, retried, claim], {JOB: "t"}) == {
        (minute, FAILURES, "jobs", "t", "ValueError"): 2
    }
