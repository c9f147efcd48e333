"""The admin UI's pure parts: ages and page cursors as typed in a URL, and an attempt
timeline built from job events."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from jobsapp.monitor.browse import (
    Cursor,
    EventRow,
    attempts_of,
    detail_text,
    parse_age,
    parse_cursor,
    search_shares,
)
from jobsapp.monitor.summary import BadFilter

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
# Fixed, not drawn: it shows in test ids, which every xdist worker must collect alike.
JOB_ID = uuid.UUID("00000000-0000-4000-8000-000000000001")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("15m", 900),
        ("2H", 7200),
        (" 3d ", 259200),
        ("3650d", 3650 * 86400),
    ],
)
def test_an_age_reads_as_seconds(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "soon", "-5m", "1.5h", "2w", "15 m", "\u0663d", "\u00b2h", "9" * 7, "9" * 5000]
)
def test_an_age_it_cannot_read_is_a_bad_filter(text: str) -> None:
    with pytest.raises(BadFilter, match="an age is a number"):
        parse_age(text)


@pytest.mark.parametrize("text", ["3651d", "999999d", "999999h"])
def test_an_age_past_the_calendar_is_a_bad_filter_not_an_overflow(text: str) -> None:
    # "now minus 999999 days" overflowed datetime: the console answered 500.
    with pytest.raises(BadFilter, match="an age is at most 3650d"):
        parse_age(text)


def test_a_cursor_survives_its_url_form() -> None:
    cursor = Cursor(T0 + timedelta(microseconds=7), uuid.uuid4())

    assert parse_cursor(cursor.encode()) == cursor


@pytest.mark.parametrize(
    "text",
    [
        "",
        "page-2",
        f"yesterday~{JOB_ID}",
        "2026-11-30T12:00:00+00:00~nope",
        f"2026-11-30T12:00:00~{JOB_ID}",  # no time zone
        f"0001-01-01T00:00:00+14:00~{JOB_ID}",
    ],  # before the calendar starts, in UTC
)
def test_a_malformed_cursor_is_a_bad_filter(text: str) -> None:
    with pytest.raises(BadFilter, match="cursor"):
        parse_cursor(text)


def event(
    attempt: int, transition: str, minute: int, actor: str = "w@h", reason: str | None = None
) -> EventRow:
    return EventRow(attempt, transition, None, None, actor, reason, T0 + timedelta(minutes=minute))


def test_attempts_are_read_from_claims_and_their_endings() -> None:
    events = [
        event(1, "enqueue", 0, "producer"),
        event(1, "claim", 1, "w1@a"),
        event(1, "retry", 2, "w1@a", "ConnectionError: down"),
        event(2, "claim", 3, "w2@b"),
        event(2, "reap_requeue", 9, "reaper", "heartbeat stale"),
        event(3, "claim", 10, "w1@a"),
        event(3, "fail", 11, "w1@a", "ValueError: bad"),
        event(4, "replay", 20, "operator:alice", "fixed"),
        event(4, "claim", 21, "w2@b"),
    ]

    found = attempts_of(events)

    assert [(a.number, a.worker, a.outcome, a.error) for a in found] == [
        (1, "w1@a", "failed, retry planned", "ConnectionError: down"),
        (2, "w2@b", "stale, requeued by the reaper", "heartbeat stale"),
        (3, "w1@a", "failed", "ValueError: bad"),
        (4, "w2@b", "running", None),
    ]
    assert (found[0].started_at, found[0].ended_at) == (
        T0 + timedelta(minutes=1),
        T0 + timedelta(minutes=2),
    )
    assert found[3].ended_at is None


def test_a_stored_failure_detail_reads_as_type_message_and_a_multiline_traceback() -> None:
    stored = {
        "type": "billing.Upstream",
        "message": "refused",
        "traceback": 'Traceback (most recent call last):\n  File "x.py"\nboom',
    }
    text = detail_text(stored)
    assert text == (
        'billing.Upstream: refused\n\nTraceback (most recent call last):\n  File "x.py"\nboom'
    )
    assert detail_text(None) is None
    assert detail_text({}) is None


@pytest.mark.parametrize(
    ("held", "shares"),
    [
        ([10, 10], [10, 10]),  # a small journal is read whole
        ([100, 100], [50, 50]),  # two large states split the budget
        ([5, 1_000, 0], [5, 95, 0]),  # what a small state leaves goes to the large one
        ([1_000, 30, 1_000], [35, 30, 35]),
        ([1_000, 1_000, 1_000], [33, 33, 34]),  # never more than the budget in all
    ],
)
def test_a_search_shares_its_rows_between_the_states(held: list[int], shares: list[int]) -> None:
    assert search_shares(held, 100) == shares
