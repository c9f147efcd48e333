"""The maintenance passes' pure decisions: rescue or fail, the reasons, the check backoff,
how the relay drains a backlog, and the beat settings read from the environment."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from jobsapp.lifecycle.journal import PendingMessage, StaleRun, registry
from jobsapp.lifecycle.journal.registry import StalePolicy
from jobsapp.lifecycle.transport import outbox
from jobsapp.maintenance import reaper, relay, scheduler
from jobsapp.maintenance.budget import Budget
from jobsapp.settings import whole_number

STALE = timedelta(seconds=30)
REQUEUE_TABLE = registry.JOBS
FAIL_TABLE = dataclasses.replace(registry.JOBS, module="strict", stale_policy=StalePolicy.FAIL)


def stale_run(*, attempt: int = 1, max_attempts: int = 5, rescues: int = 0) -> StaleRun:
    return StaleRun(
        job_id=uuid.uuid4(),
        attempt=attempt,
        rescues=rescues,
        max_attempts=max_attempts,
        task_name="tests.echo",
        ids={},
    )


# ------------------------------------------------------------------ reaper decisions


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "rescues", "expected"),
    [
        (1, 5, 0, True),  # a first death: rescued
        (4, 5, 2, True),  # attempts and rescues to spare
        (5, 5, 0, False),  # the last attempt died: nothing left to try
        (2, 5, 3, False),  # rescued three times: a job that kills its worker
        (1, 1, 0, False),  # a single-attempt task is never retried by the reaper
    ],
)
def test_requeue_needs_attempts_and_rescues_to_spare(
    attempt: int, max_attempts: int, rescues: int, expected: bool
) -> None:
    run = stale_run(attempt=attempt, max_attempts=max_attempts, rescues=rescues)
    assert reaper.should_requeue(run, REQUEUE_TABLE) is expected


def test_a_fail_policy_table_never_requeues() -> None:
    assert reaper.should_requeue(stale_run(), FAIL_TABLE) is False


def test_the_rescue_ceiling_is_per_table() -> None:
    lenient = dataclasses.replace(REQUEUE_TABLE, rescue_limit=10)
    run = stale_run(attempt=4, max_attempts=20, rescues=5)
    assert (reaper.should_requeue(run, REQUEUE_TABLE), reaper.should_requeue(run, lenient)) == (
        False,
        True,
    )


def test_each_decision_has_its_own_reason() -> None:
    base = "heartbeat older than 30s: the worker died or froze"
    cases = {
        "requeued": stale_run(),
        "rescued 3 times already: a job that kills its worker": stale_run(rescues=3),
        "no attempts left": stale_run(attempt=5),
    }
    for tail, run in cases.items():
        assert reaper.reason_for(run, REQUEUE_TABLE, STALE) == f"{base}; {tail}"
    assert reaper.reason_for(stale_run(), FAIL_TABLE, STALE) == (
        f"{base}; this run table fails stale runs"
    )


def test_a_fail_policy_reason_does_not_blame_the_attempts() -> None:
    # The table's policy is why it failed, even when the attempts were spent as well.
    reason = reaper.reason_for(stale_run(attempt=5), FAIL_TABLE, STALE)
    assert reason.endswith("this run table fails stale runs")


def test_reasons_name_fractional_stale_limits() -> None:
    reason = reaper.reason_for(stale_run(), REQUEUE_TABLE, timedelta(seconds=2.5))
    assert reason.startswith("heartbeat older than 2.5s")


@pytest.mark.parametrize(
    "bad",
    [
        {"stale_after": timedelta(0)},
        {"stale_after": STALE, "batch": 0},
        {"stale_after": STALE, "max_batches": 0},
    ],
)
def test_reaper_config_refuses_nonsense(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="reaper needs"):
        reaper.ReaperConfig(**bad)


# ------------------------------------------------------------------ relay decisions

MINUTE = timedelta(minutes=1)


def test_the_claim_check_doubles_with_every_publish() -> None:
    checks = [outbox.check_wait(count, MINUTE) for count in range(4)]
    assert checks == [MINUTE, 2 * MINUTE, 4 * MINUTE, 8 * MINUTE]


def test_the_claim_check_backoff_is_capped() -> None:
    cap = MINUTE * 2**outbox.MAX_CHECK_BACKOFF
    assert outbox.check_wait(outbox.MAX_CHECK_BACKOFF, MINUTE) == cap
    assert outbox.check_wait(10_000, MINUTE) == cap


def _steps(*results: relay.Done) -> tuple[list[int], relay.Step]:
    calls: list[int] = []
    pending = list(results)

    def step() -> relay.Done:
        calls.append(1)
        return pending.pop(0)

    return calls, step


FULL = relay.Done(10, 10)
ENDLESS = Budget(3600)


def test_drain_repeats_full_batches_until_a_short_one() -> None:
    cfg = relay.RelayConfig(batch=10, max_batches=5)
    calls, step = _steps(FULL, FULL, relay.Done(3, 3))
    assert relay.drain(step, cfg, ENDLESS) == (23, 0, False)
    assert len(calls) == 3


def test_drain_stops_at_the_batch_ceiling() -> None:
    cfg = relay.RelayConfig(batch=10, max_batches=2)
    calls, step = _steps(FULL, FULL, FULL)
    assert relay.drain(step, cfg, ENDLESS)[0] == 20
    assert len(calls) == 2


def test_drain_goes_on_past_rows_that_refused_on_their_own() -> None:
    # Refused rows were backed off: the next batch holds other rows.
    cfg = relay.RelayConfig(batch=10, max_batches=5)
    calls, step = _steps(relay.Done(10, 7, dead=1), relay.Done(4, 4))
    assert relay.drain(step, cfg, ENDLESS) == (11, 1, False)
    assert len(calls) == 2


def test_drain_stops_at_the_first_broker_error() -> None:
    cfg = relay.RelayConfig(batch=10, max_batches=5)
    calls, step = _steps(relay.Done(10, 2, broker_down=True), FULL)
    assert relay.drain(step, cfg, ENDLESS) == (2, 0, True)
    assert len(calls) == 1


def test_drain_stops_when_the_budget_is_spent_or_the_lease_lost() -> None:
    cfg = relay.RelayConfig(batch=10, max_batches=5)
    for budget in (Budget(0), Budget(3600, still_leading=lambda: False)):
        calls, step = _steps(FULL, FULL)
        assert relay.drain(step, cfg, budget)[0] == 10
        assert len(calls) == 1


def test_a_refused_row_backs_off_doubling_then_dies() -> None:
    pauses = [outbox.retry_after_refusal(n) for n in range(1, outbox.MAX_PUBLISH_FAILURES + 1)]
    assert pauses[0] == outbox.REFUSAL_BACKOFF
    assert pauses[1] == 2 * outbox.REFUSAL_BACKOFF
    assert all(p is not None and p <= outbox.MAX_REFUSAL_BACKOFF for p in pauses[:-1])
    assert pauses[-1] is None


@pytest.mark.parametrize(
    "bad",
    [{"batch": 0}, {"max_batches": 0}, {"unclaimed_after": timedelta(0)}],
)
def test_relay_config_refuses_nonsense(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="relay needs"):
        relay.RelayConfig(**bad)


# ------------------------------------------------------------------ beat settings


def test_cadences_come_from_the_environment_by_task() -> None:
    found = scheduler.cadence_overrides({"JOBSAPP_REAPER_EVERY": "1", "JOBSAPP_RELAY_EVERY": "0.5"})
    assert found == {
        "jobsapp.maintenance.reaper": timedelta(seconds=1),
        "jobsapp.maintenance.relay": timedelta(seconds=0.5),
    }
    assert scheduler.cadence_overrides({"JOBSAPP_RETENTION_EVERY": " "}) == {}


@pytest.mark.parametrize("raw", ["soon", "0", "-3", "nan"])
def test_a_bad_cadence_fails_naming_the_variable(raw: str) -> None:
    with pytest.raises(ValueError, match="JOBSAPP_REAPER_EVERY"):
        scheduler.cadence_overrides({"JOBSAPP_REAPER_EVERY": raw})


def test_the_lease_defaults_to_thirty_seconds() -> None:
    assert scheduler.lease_ttl_from_env({}) == timedelta(seconds=30)
    assert scheduler.lease_ttl_from_env({"JOBSAPP_BEAT_LEASE_SECONDS": "3"}) == timedelta(seconds=3)
    with pytest.raises(ValueError, match="JOBSAPP_BEAT_LEASE_SECONDS"):
        scheduler.lease_ttl_from_env({"JOBSAPP_BEAT_LEASE_SECONDS": "inf"})


@pytest.mark.usefixtures("lease_check_kept")
def test_beat_applies_the_cadences_to_the_maintenance_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobsapp.celery_app import app

    monkeypatch.setenv("JOBSAPP_REAPER_EVERY", "0.25")
    monkeypatch.delenv("JOBSAPP_RELAY_EVERY", raising=False)
    beat = scheduler.LeasedScheduler(app=app, lazy=False)
    by_task = {e.task: e for e in beat.schedule.values()}
    reaper_entry = by_task["jobsapp.maintenance.reaper"].schedule
    relay_entry = by_task["jobsapp.maintenance.relay"].schedule
    assert reaper_entry.run_every == timedelta(seconds=0.25)
    # Without a variable the configured cadence stays.
    assert relay_entry.run_every == app.conf.beat_schedule["outbox-relay"]["schedule"]


def test_batch_sizes_come_from_the_environment() -> None:
    assert whole_number({}, "JOBSAPP_RELAY_BATCH", 500) == 500
    assert whole_number({"JOBSAPP_RELAY_BATCH": "25"}, "JOBSAPP_RELAY_BATCH", 500) == 25
    for raw in ("0", "-1", "ten", "2.5"):
        with pytest.raises(ValueError, match="JOBSAPP_RELAY_BATCH"):
            whole_number({"JOBSAPP_RELAY_BATCH": raw}, "JOBSAPP_RELAY_BATCH", 500)


def _unclaimed(n: int, queue: str) -> list[PendingMessage]:
    due = datetime(2026, 12, 1, tzinfo=UTC)
    return [
        PendingMessage(i, uuid.uuid4(), 1, "t", {}, due, publish_count=1, queue=queue)
        for i in range(n)
    ]


@pytest.mark.parametrize(("depth", "lost"), [(0, 3), (1, 2), (3, 0), (500, 0)])
def test_a_queue_holding_n_messages_may_hold_the_n_newest_unclaimed(depth: int, lost: int) -> None:
    messages = _unclaimed(3, "a")
    gone, waiting = outbox.lost_and_waiting(
        messages, {"a": depth}, lambda m: str(m.queue), lowest_first=False
    )
    assert gone == messages[:lost]  # the oldest are the ones a FIFO queue cannot hold
    assert waiting == messages[lost:]


@pytest.mark.parametrize(
    ("lowest_first", "urgent_priority", "others"),
    [(True, 0, 5), (False, 9, 0)],
    ids=["redis", "rabbitmq"],
)
def test_a_queue_holding_n_messages_may_hold_the_n_it_serves_last(
    lowest_first: bool, urgent_priority: int, others: int
) -> None:
    """An urgent message (the broker's meaning) is served before older ones: a queue that
    holds two of these three may hold both others, so only the urgent one is certainly gone."""
    old_low, urgent, new_low = (dataclasses.replace(m, priority=others) for m in _unclaimed(3, "a"))
    urgent = dataclasses.replace(urgent, priority=urgent_priority)
    gone, waiting = outbox.lost_and_waiting(
        [old_low, urgent, new_low], {"a": 2}, lambda m: str(m.queue), lowest_first=lowest_first
    )
    assert (gone, waiting) == ([urgent], [old_low, new_low])


def test_each_queue_is_judged_by_its_own_depth() -> None:
    a, b = _unclaimed(2, "a"), _unclaimed(2, "b")
    gone, waiting = outbox.lost_and_waiting(
        [*a, *b], {"a": 5}, lambda m: str(m.queue), lowest_first=True
    )
    assert (gone, waiting) == (b, a)


def test_a_pass_report_is_one_readable_line_and_an_idle_pass_says_nothing() -> None:
    reaped = scheduler.report_line(
        "jobsapp.maintenance.reaper", {"jobs": 2, "attachments": 0, "widgets": 1}
    )
    assert reaped == "maintenance reaper: jobs=2, widgets=1"
    assert scheduler.report_line("jobsapp.maintenance.relay", {"published": 0, "failed": 0}) is None
    metrics = scheduler.report_line("jobsapp.maintenance.metrics", {"events": 40})
    assert metrics == "maintenance metrics: events=40"
