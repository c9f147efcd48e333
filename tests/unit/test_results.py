"""What a run keeps of its body's return value (``lifecycle/results.py``): pure."""

from __future__ import annotations

import math
import uuid
from decimal import Decimal

import pytest

from jobsapp.lifecycle.errors import PermanentError, ResultRefused
from jobsapp.lifecycle.results import checked


def test_json_is_kept_as_returned_and_none_is_no_result() -> None:
    value = {"ids": [1, 2], "ok": True, "name": "é"}
    assert checked("t", value, 100) is value
    assert checked("t", None, 1) is None


def test_the_cap_counts_compact_utf8_json_bytes() -> None:
    # "é" is two bytes in UTF-8; the JSON string adds two quotes.
    assert checked("t", "é" * 4, 10) == "é" * 4
    with pytest.raises(ResultRefused) as over:
        checked("t", "é" * 5, 10)
    assert over.value.error_code == "result_too_large"
    assert "t returned 12 bytes of JSON, over the result cap of 10 bytes" in str(over.value)


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"when": uuid.uuid4()}, "a UUID, not JSON: pass str(value)"),
        ([Decimal("1.5")], "a Decimal, not JSON: pass str(value)"),
        ({1, 2}, "a set, not JSON: pass str, int, float, bool, None, list, dict"),
        ([math.nan], "a float, not JSON"),
        ("\ud800", "text with a lone surrogate, not JSON: pass valid Unicode"),
    ],
)
def test_what_json_cannot_carry_is_named_with_what_to_return(value: object, named: str) -> None:
    with pytest.raises(ResultRefused) as refused:
        checked("billing.stamp", value, 1000)
    assert refused.value.error_code == "result_not_json"
    assert isinstance(refused.value, PermanentError)  # never retried
    assert f"billing.stamp returned {named}" in str(refused.value)
