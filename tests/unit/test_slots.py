"""Periodic slots, pure: a slot's job id, the slots of a schedule, and the missed-slot policy."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from celery.beat import ScheduleEntry
from celery.schedules import crontab, schedule

from jobsapp.celery_app import app
from jobsapp.maintenance import periodic, periodic_slots

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)
EVERY_SECOND = periodic_slots.every(SECOND)
WINDOW = timedelta(seconds=10)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def plan(last: float | None, now: float, limit: int = 100) -> periodic_slots.Plan:
    return periodic_slots.plan(
        EVERY_SECOND,
        last=None if last is None else at(last),
        now=at(now),
        window=WINDOW,
        limit=limit,
    )


# ------------------------------------------------------------------ job ids


def test_a_slot_has_one_job_id_whatever_the_timezone_it_is_written_in() -> None:
    paris = T0.astimezone(timezone(timedelta(hours=1)))

    assert periodic_slots.slot_job_id("report", T0) == periodic_slots.slot_job_id("report", paris)
    assert periodic_slots.slot_job_id("report", T0).version == 5


def test_another_slot_or_another_entry_is_another_job() -> None:
    ids = {
        periodic_slots.slot_job_id("report", T0),
        periodic_slots.slot_job_id("report", at(1)),
        periodic_slots.slot_job_id("digest", T0),
        periodic_slots.slot_job_id("report", at(0.000001)),
    }

    assert len(ids) == 4


def test_the_derivation_is_stable_across_releases() -> None:
    # Slots already in journals keep their ids: the namespace and the text never change.
    namespace = uuid.UUID("0b6f6c1e-3d1a-5c55-9a4e-7d3c2a9e4f10")

    text = "report\n2026-03-01T12:00:00+00:00"

    assert periodic_slots.slot_job_id("report", T0) == uuid.uuid5(namespace, text)
    assert str(periodic_slots.slot_job_id("report", T0)) == "71d2299a-6395-59f6-bd9c-94226d2be5b8"


def test_a_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        periodic_slots.slot_job_id("report", datetime(2026, 3, 1, 12))


# ------------------------------------------------------------------ schedules


def test_interval_slots_are_aligned_to_the_epoch_not_to_when_a_beat_started() -> None:
    every_minute = periodic_slots.every(timedelta(minutes=1))

    assert every_minute(at(0)) == at(60)
    assert every_minute(at(59.9)) == at(60)
    assert every_minute(at(-0.5)) == at(0)


def test_a_crontab_entry_has_the_crontab_times() -> None:
    entry = periodic.periodic_entry(app, _entry("tests.echo", crontab(minute="*/15")))
    assert entry is not None

    assert entry.next_after(at(0)) == at(15 * 60)
    assert entry.next_after(at(14 * 60 + 59)) == at(15 * 60)
    assert entry.next_after(at(-1)) == at(0)


def test_an_entry_of_a_plain_task_is_left_to_celery() -> None:
    assert periodic.periodic_entry(app, _entry("jobsapp.maintenance.reaper", SECOND)) is None


def test_a_schedule_with_no_derivable_slots_is_refused_at_start() -> None:
    class Jittered(schedule):
        """A schedule of its own idea of when it is due: no two beats would agree."""

    with pytest.raises(ValueError, match="not an interval or a crontab"):
        periodic.periodic_entry(app, _entry("tests.echo", Jittered(SECOND)))


def test_an_option_a_slot_cannot_honour_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match=r"not \['expires'\]"):
        periodic.periodic_entry(app, _entry("tests.echo", SECOND, options={"expires": 5}))


def _entry(task: str, schedule: object, **extra: object) -> ScheduleEntry:
    import tests.support.tasks  # noqa: F401 - registers tests.echo

    return ScheduleEntry(
        name="e", task=task, schedule=schedule, app=app, kwargs={"token": "t"}, **extra
    )


# ------------------------------------------------------------------ the missed-slot policy


def test_a_leader_enqueues_each_new_slot_once() -> None:
    assert plan(last=4, now=5.5).due == (at(5),)
    assert plan(last=5, now=5.9).due == ()


def test_a_beat_that_just_took_the_lead_enqueues_every_slot_of_the_window() -> None:
    # The journal answers duplicate for the slots the previous leader enqueued.
    assert plan(last=None, now=20).due == tuple(at(s) for s in range(11, 21))


def test_slots_missed_within_the_window_are_caught_up_in_order() -> None:
    found = plan(last=4, now=9.5)

    assert found.due == (at(5), at(6), at(7), at(8), at(9))
    assert found.skipped is None


def test_slots_older_than_the_window_are_skipped_and_said_so() -> None:
    found = plan(last=4, now=30)

    assert found.due == tuple(at(s) for s in range(21, 31))
    assert found.skipped == (at(5), at(20))


def test_a_slot_exactly_one_window_old_is_skipped() -> None:
    assert plan(last=None, now=20).due[0] == at(11)
    assert plan(last=9, now=20).skipped == (at(10), at(10))


def test_a_long_catch_up_is_bounded_per_tick_and_resumes_where_it_stopped() -> None:
    first = plan(last=None, now=20, limit=3)
    second = plan(last=first.due[-1].timestamp() - T0.timestamp(), now=20, limit=100)

    assert first.due == (at(11), at(12), at(13))
    assert second.due == tuple(at(s) for s in range(14, 21))


def test_recent_slots_are_the_latest_ones() -> None:
    found = periodic_slots.recent(EVERY_SECOND, now=at(10), span=timedelta(seconds=100), limit=3)

    assert found == [at(8), at(9), at(10)]


# Without the entry's catch_up option, as Celery runs a missed entry: once, the latest.


def latest(last: float | None, now: float) -> periodic_slots.Plan:
    return periodic_slots.plan(
        EVERY_SECOND,
        last=None if last is None else at(last),
        now=at(now),
        window=WINDOW,
        limit=3,
        catch_up=False,
    )


def test_a_new_entry_runs_once_at_its_latest_slot_not_every_slot_of_the_window() -> None:
    found = latest(last=None, now=20)
    assert (found.due, found.superseded) == ((at(20),), 9)


def test_missed_slots_run_once_as_the_latest_even_past_the_per_tick_bound() -> None:
    found = latest(last=4, now=9.5)
    assert (found.due, found.superseded, found.skipped) == ((at(9),), 4, None)


def test_an_entry_on_time_runs_each_slot_without_catch_up_too() -> None:
    assert latest(last=4, now=5.5).due == (at(5),)
    assert latest(last=5, now=5.9).due == ()


@pytest.mark.parametrize(
    ("when", "said"),
    [
        (schedule(timedelta(seconds=30)), "every 30 s"),
        (schedule(300), "every 5 min"),
        (schedule(7200), "every 2 h"),
        (schedule(1.5), "every 1.5 s"),
        (crontab(hour=2, minute=0), "crontab 0 2 * * *"),
    ],
    ids=["seconds", "minutes", "hours", "fraction", "crontab"],
)
def test_a_schedule_reads_as_an_operator_says_it(when: Any, said: str) -> None:
    assert periodic.described(when) == said
