"""The reconcile decision: which failure records a domain's policy takes again."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobsapp.attachments.models import ATTACHMENT_RUNS
from jobsapp.lifecycle.registry import ReconcilePolicy
from jobsapp.maintenance.reconcile import NeverRetaken, retake_code, wanted_codes

EXHAUSTED = ("TransientError: storage_unavailable; caused by StorageUnavailable: could not "
             "connect to the endpoint")  # fmt: skip
CORRUPT = "[corrupt_image] AttachmentFailed: the image cannot be decoded"
POLICY = ATTACHMENT_RUNS.reconcile
assert POLICY is not None


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (EXHAUSTED, "storage_unavailable"),
        ("[unknown_pipeline] AttachmentFailed: no pipeline version 9", "unknown_pipeline"),
        (CORRUPT, None),
        ("[pixel_limit] AttachmentFailed: 90000 x 90000", None),
        # A whole word only: a longer code that merely contains a retaken one is not it.
        ("TransientError: storage_unavailable_forever", None),
        (None, None),
    ],
)
def test_attachments_take_outage_and_deploy_failures_again(
    record: str | None, expected: str | None
) -> None:
    assert retake_code(record, POLICY.retake, POLICY.never) == expected


def test_a_never_code_wins_over_a_retaken_one_in_the_same_record() -> None:
    both = "[corrupt_image] AttachmentFailed: decoding failed; caused by storage_unavailable"
    assert retake_code(both, POLICY.retake, POLICY.never) is None


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
