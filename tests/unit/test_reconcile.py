"""The reconcile decision: which failure records a domain's policy takes again, and for
the others the rule that holds each back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobsapp.attachments.models import ATTACHMENT_RUNS
from jobsapp.lifecycle.journal.registry import JOBS, ReconcilePolicy, RunTable
from jobsapp.maintenance.reconcile import (
    BATCH_FULL,
    Failure,
    HeldBack,
    NeverRetaken,
    Retake,
    Rule,
    code_decision,
    decide,
    wanted_codes,
)

EXHAUSTED = (
    "TransientError: storage_unavailable; caused by StorageUnavailable: could not "
    "connect to the endpoint"
)
CORRUPT = "[corrupt_image] AttachmentFailed: the image cannot be decoded"


def policy_of(spec: RunTable) -> ReconcilePolicy:
    assert spec.reconcile is not None
    return spec.reconcile


POLICY = policy_of(ATTACHMENT_RUNS)


RETAKEN = ", ".join(sorted(POLICY.retake))


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (EXHAUSTED, Retake("storage_unavailable")),
        ("[unknown_pipeline] AttachmentFailed: no pipeline version 9", Retake("unknown_pipeline")),
        (CORRUPT, HeldBack(Rule.NEVER_RETAKEN, "corrupt_image")),
        (
            "[pixel_limit] AttachmentFailed: 90000 x 90000",
            HeldBack(Rule.NEVER_RETAKEN, "pixel_limit"),
        ),
        # A whole word only: a longer code that merely contains a retaken one is not it.
        ("TransientError: storage_unavailable_forever", HeldBack(Rule.NOT_RETRYABLE, RETAKEN)),
        (None, HeldBack(Rule.NOT_RETRYABLE, RETAKEN)),
    ],
)
def test_attachments_take_outage_and_deploy_failures_again(
    record: str | None, expected: Retake | HeldBack
) -> None:
    assert code_decision(record, POLICY.retake, POLICY.never) == expected


def test_a_never_code_wins_over_a_retaken_one_in_the_same_record() -> None:
    both = "[corrupt_image] AttachmentFailed: decoding failed; caused by storage_unavailable"
    assert code_decision(both, POLICY.retake, POLICY.never) == HeldBack(
        Rule.NEVER_RETAKEN, "corrupt_image"
    )


# ------------------------------------------------------------- why a run is held back

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GENERIC = policy_of(JOBS)  # TransientError, 30 minutes' cool-down, one round
LONG_AGO = NOW - timedelta(hours=2)


def failure(
    error: str = "TransientError: upstream down",
    *,
    outcome: str = "exhausted",
    finished_at: datetime = LONG_AGO,
    rounds: int = 0,
) -> Failure:
    return Failure(outcome, error, finished_at, rounds)


def why(case: Failure) -> Retake | HeldBack:
    return decide(case, GENERIC, GENERIC.retake, NOW)


def rule_of(case: Failure) -> Rule:
    held = why(case)
    assert isinstance(held, HeldBack), held
    return held.rule


def test_a_transient_failure_past_its_cool_down_and_under_the_cap_is_retaken() -> None:
    assert why(failure()) == Retake("TransientError")
    # Exactly at the end of the cool-down: the same boundary as the query's ``<=``.
    assert why(failure(finished_at=NOW - GENERIC.cool_down)) == Retake("TransientError")


@pytest.mark.parametrize(
    ("case", "rule", "line"),
    [
        (
            failure(outcome="cancelled"),
            Rule.NOT_A_FAILURE,
            "outcome cancelled: reconcile retakes only exhausted, permanent or stale runs",
        ),
        (
            failure("KeyError: 'x'"),
            Rule.NOT_RETRYABLE,
            "error code not retryable: the error carries none of TransientError",
        ),
        (failure(rounds=1), Rule.ROUNDS_CAP, "rounds cap reached: 1 of 1 reconcile rounds spent"),
        (
            failure(finished_at=NOW - timedelta(minutes=5)),
            Rule.COOL_DOWN,
            "cool-down until 2026-03-01T12:25:00+00:00",
        ),
    ],
    ids=["cancelled", "not-retryable", "rounds-cap", "cool-down"],
)
def test_each_failure_left_alone_names_its_rule_in_one_line(
    case: Failure, rule: Rule, line: str
) -> None:
    held = why(case)
    assert isinstance(held, HeldBack)
    assert (held.rule, held.line()) == (rule, line)


def test_a_never_code_is_named_in_its_line() -> None:
    held = decide(failure(CORRUPT, outcome="permanent"), POLICY, POLICY.retake, NOW)
    assert held == HeldBack(Rule.NEVER_RETAKEN, "corrupt_image")
    assert isinstance(held, HeldBack)
    assert held.line() == "error code corrupt_image is never retaken"


def test_lasting_rules_are_named_before_the_cool_down_which_only_delays() -> None:
    recent = NOW - timedelta(minutes=1)
    assert rule_of(failure("KeyError", finished_at=recent, rounds=1)) is Rule.NOT_RETRYABLE
    assert rule_of(failure(finished_at=recent, rounds=1)) is Rule.ROUNDS_CAP
    assert rule_of(failure(outcome="skipped", rounds=1)) is Rule.NOT_A_FAILURE


def test_by_hand_the_wanted_code_is_the_one_named() -> None:
    held = decide(failure(), GENERIC, wanted_codes(GENERIC, "KeyError"), NOW)
    assert isinstance(held, HeldBack)
    assert held.line() == "error code not retryable: the error carries none of KeyError"
    assert BATCH_FULL.line() == "batch full: a later pass takes it"


def test_by_hand_an_operator_names_any_code_the_domain_does_not_forbid() -> None:
    assert wanted_codes(POLICY, None) == POLICY.retake
    assert wanted_codes(POLICY, "staging_error") == {"staging_error"}
    with pytest.raises(NeverRetaken):
        wanted_codes(POLICY, "corrupt_image")


def test_a_policy_that_retakes_what_it_forbids_is_refused() -> None:
    with pytest.raises(ValueError, match="both retaken and never"):
        ReconcilePolicy(retake=frozenset({"x"}), never=frozenset({"x"}))
    with pytest.raises(ValueError, match="positive"):
        ReconcilePolicy(retake=frozenset({"x"}), cool_down=timedelta(seconds=-1))
