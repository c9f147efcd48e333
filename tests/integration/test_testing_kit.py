"""The testing kit's own tests (jobsapp/testing/kit.py): what a team's test asserts with it,
on both dialects, through the real lifecycle. The team's view of it, from the wheel, is
examples/team_app/tests (tests/e2e/test_wheel.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import chain
from sqlalchemy import Engine

from jobsapp.celery_app import app
from jobsapp.testing import Kit
from tests.support.env import SESSION
from tests.support.kit_tasks import (
    RAN,
    charge,
    export,
    flaky,
    plain,
    quick_retry,
    report,
    step,
)

HOUR = timedelta(hours=1)


@pytest.fixture
def kit(db: Engine) -> Iterator[Kit]:
    RAN.clear()
    jobsapp = Kit(app, db)
    jobsapp.reset()
    yield jobsapp
    jobsapp.reset()


def _only(jobsapp: Kit, task: Any) -> Any:
    (run,) = jobsapp.runs(task)
    return run


def test_a_retry_runs_when_the_clock_reaches_its_backoff_not_before(kit: Kit) -> None:
    flaky.delay("a", 1)
    assert kit.drain() == {"retried": 1}
    kit.assert_enqueued(flaky, countdown=60)
    assert kit.drain() == {}  # due in 60 s: nothing runs now
    # 10 s short of it: the kit's clock is the database's, which a loaded machine moves on
    # by seconds between the retry's decision and this drain.
    kit.advance(50)
    assert kit.drain() == {}
    kit.advance(10)
    assert kit.drain() == {"succeeded": 1}
    run = _only(kit, flaky)
    assert (run.state, run.attempts, run.result) == ("succeeded", 2, "a done")


def test_a_countdown_matches_however_late_the_assertion_comes(kit: Kit) -> None:
    """A loaded machine's assertion comes seconds after the retry was decided: the countdown
    the job was given still matches, and one it was not given still does not."""
    flaky.delay("late", 1)
    assert kit.drain() == {"retried": 1}
    time.sleep(2.5)  # the delay a loaded CI machine put between the retry and the assertion
    kit.assert_enqueued(flaky, countdown=60)
    kit.refute_enqueued(flaky, countdown=55)
    kit.refute_enqueued(flaky, countdown=64)
    kit.advance(30)
    kit.assert_enqueued(flaky, countdown=30)


def test_a_short_backoff_rides_a_broker_countdown_that_the_clock_also_moves(kit: Kit) -> None:
    quick_retry.delay("b")
    assert kit.drain() == {"retried": 1}
    assert kit.drain() == {}
    kit.advance(2)
    assert kit.drain() == {"succeeded": 1}
    assert _only(kit, quick_retry).attempts == 2


def test_drain_with_scheduled_moves_the_clock_to_each_due_retry(kit: Kit) -> None:
    before = kit.now()
    flaky.delay("c", 2)
    assert kit.drain(with_scheduled=True) == {"retried": 2, "succeeded": 1}
    assert kit.now() - before >= timedelta(seconds=60 + 120)
    assert _only(kit, flaky).attempts == 3


def test_perform_runs_one_job_to_its_end_moving_the_clock_over_its_backoffs(kit: Kit) -> None:
    before = kit.now()
    run = kit.perform(flaky, "p", 2)
    assert (run.state, run.attempts, run.result) == ("succeeded", 3, "p done")
    assert kit.now() - before >= timedelta(seconds=60 + 120)
    assert kit.drain() == {}  # the broker's copies of its attempts start nothing


def test_perform_tells_a_failure_with_its_stored_error(kit: Kit) -> None:
    run = kit.perform(charge, "acct-1")
    assert (run.state, run.outcome, run.attempts) == ("failed", "permanent", 1)
    assert run.last_error == "[permanent] PermanentError: no such account acct-1"
    assert run.error is not None
    assert run.error.endswith("no such account acct-1\n")


def test_a_countdown_and_an_eta_are_matched_and_run_when_due(kit: Kit) -> None:
    at = kit.now() + HOUR
    step.apply_async(("x", "later"), countdown=90)
    step.apply_async(("x", "at-eta"), eta=at)
    step.apply_async(("x", "soon"), countdown=2)  # within the inline wait: a broker countdown
    kit.assert_enqueued(step, args=("x", "later"), countdown=90)
    kit.assert_enqueued(step, args=("x", "later"), eta=kit.now() + timedelta(seconds=90))
    kit.assert_enqueued(step, args=("x", "at-eta"), eta=at)
    kit.refute_enqueued(step, eta=kit.now())
    assert kit.drain() == {}
    kit.advance(2)
    assert kit.drain() == {"succeeded": 1}
    kit.advance(88)
    assert kit.drain() == {"succeeded": 1}
    kit.advance(HOUR)
    assert kit.drain() == {"succeeded": 1}
    assert RAN == ["soon", "later", "at-eta"]


def test_the_clock_moves_only_forward(kit: Kit) -> None:
    with pytest.raises(ValueError, match=r"advance takes a number of seconds >= 0, not -1"):
        kit.advance(-1)


def test_an_expiry_comes_with_the_clock(kit: Kit) -> None:
    step.apply_async(("x", "stale"), countdown=60, expires=30)
    kit.advance(60)
    assert kit.drain() == {}  # its message came after the expiry: no attempt
    run = _only(kit, step)
    assert (run.state, run.outcome) == ("failed", "expired")
    assert RAN == []


def test_an_eta_that_does_not_match_says_what_is_queued(kit: Kit) -> None:
    step.apply_async(("x", "later"), countdown=90)
    with pytest.raises(AssertionError) as failed:
        kit.assert_enqueued(step, args=("x", "later"), countdown=30)
    text = str(failed.value)
    assert text.startswith(
        "no queued tests.kit.step job with args=('x', 'later'), countdown=30 (eta 20"
    )
    assert "queued tests.kit.step jobs (the kit's clock: " in text
    assert "args=('x', 'later') kwargs={} key=" in text
    assert text.rstrip().endswith(": queued")
    with pytest.raises(
        AssertionError, match=r"1 queued tests.kit.step job\(s\) with countdown=90 \(eta "
    ):
        kit.refute_enqueued(step, countdown=90)


def test_drain_reads_every_queue_a_job_was_sent_to(kit: Kit) -> None:
    elsewhere = f"jobsapp-tests-kit-{SESSION}"
    step.apply_async(("x", "there"), queue=elsewhere)
    kit.assert_enqueued(step, queue=elsewhere)
    assert kit.drain() == {"succeeded": 1}
    assert RAN == ["there"]


def test_a_plain_tasks_message_on_a_queue_of_its_own_is_drained_or_purged(kit: Kit) -> None:
    """A plain task's queue chosen by its call is named by no outbox row: ``drain()`` runs
    its message, and one a test left behind is gone by the next test (it ran there)."""
    elsewhere = f"jobsapp-tests-kit-plain-{SESSION}"
    plain.apply_async(("drained",), queue=elsewhere)
    assert kit.drain() == {"ran": 1}
    plain.apply_async(("left behind",), queue=elsewhere)
    kit.reset()
    assert kit.drain(queue=elsewhere) == {}
    assert RAN == ["drained"]


def test_a_task_is_taken_by_name_and_a_plain_one_refused_in_one_line(kit: Kit) -> None:
    """A Celery team passes a task's name, a plain task or a signature: the name is taken,
    the others refused saying what the kit reads (they failed on ``.run_table``)."""
    step.delay("a", "b")
    kit.assert_enqueued("tests.kit.step", args=("a", "b"))
    for wrong in (plain, step.s("a", "b"), "tests.kit.nothing"):
        with pytest.raises(TypeError, match=r"is not a lifecycle task .*: the kit's assertions"):
            kit.assert_enqueued(wrong)
    with pytest.raises(TypeError, match="is not a lifecycle task"):
        kit.perform(plain, "x")


def test_a_chain_is_drained_to_its_end(kit: Kit) -> None:
    chain(step.s("we", "went"), step.s("on"), step.s("home")).delay()
    assert kit.drain() == {"succeeded": 3}
    assert RAN == ["went", "on", "home"]
    runs = kit.assert_succeeded(step)
    assert runs[-1].result == "we went on home"


def test_a_key_limit_runs_two_at_once_and_the_third_when_a_slot_frees(kit: Kit) -> None:
    for part in (1, 2, 3):
        export.delay("acme", part)
    export.delay("other", 1)
    waiting = [(r.args, r.waiting) for r in kit.runs(export)]
    assert waiting == [
        (("acme", 1), False),
        (("acme", 2), False),
        (("acme", 3), True),  # over the limit: queued, no message yet
        (("other", 1), False),
    ]
    assert len(kit.enqueued(export, key="export:acme")) == 3
    assert kit.drain() == {"succeeded": 4}
    # The third part of acme's starts only once one of the first two has finished.
    assert RAN.index("acme/3") > min(RAN.index("acme/1"), RAN.index("acme/2"))
    assert [r.result for r in kit.assert_succeeded(export, key="export:acme")] == [1, 2, 3]


def test_one_run_per_key_skips_the_second_job(kit: Kit) -> None:
    first, second = report.delay("acme"), report.delay("acme")
    assert (first.outcome.value, second.outcome.value) == ("enqueued", "skipped")
    assert kit.drain() == {"succeeded": 1}
    assert [r.result for r in kit.runs(report)] == ["acme"]


def test_a_failed_run_fails_the_assertion_with_its_stored_traceback(kit: Kit) -> None:
    charge.delay("acct-9")
    assert kit.drain() == {"failed": 1}
    with pytest.raises(AssertionError) as failed:
        kit.assert_succeeded(charge)
    text = str(failed.value)
    assert text.startswith("1 of 1 tests.kit.charge runs did not succeed:\n- job ")
    assert "args=('acct-9',)" in text
    assert (
        ": failed, outcome permanent, attempts 1: "
        "[permanent] PermanentError: no such account acct-9"
    ) in text
    assert "    Traceback (most recent call last):" in text
    assert 'raise PermanentError(f"no such account {account}")' in text
    assert _only(kit, charge).error is not None
