"""What a run keeps of its body's return value (``lifecycle/rules/results.py``): pure."""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, date, datetime, time
from decimal import Decimal

import pytest
from kombu.utils import json as kombu_json

from jobsapp.lifecycle.rules.errors import PermanentError, ResultRefused
from jobsapp.lifecycle.rules.results import checked, decoded, stored


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


class Opaque:
    """A value kombu's JSON encoder does not know."""


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({1, 2}, "a set, not JSON: pass a list"),
        (
            {"x": Opaque()},
            "a Opaque, not JSON: pass str, int, float, bool, None, list, dict, "
            "or one of kombu's JSON types",
        ),
        ([math.nan], "a float, not JSON"),
        (
            {"__type__": "money", "__value__": 1},
            "a dict, not JSON: a dict of just __type__ and __value__ is kombu's marker",
        ),
        ("\ud800", "text with a lone surrogate, not JSON: pass valid Unicode"),
    ],
)
def test_what_json_cannot_carry_is_named_with_what_to_return(value: object, named: str) -> None:
    with pytest.raises(ResultRefused) as refused:
        checked("billing.stamp", value, 1000)
    assert refused.value.error_code == "result_not_json"
    assert isinstance(refused.value, PermanentError)  # never retried
    assert f"billing.stamp returned {named}" in str(refused.value)


KOMBU_TYPES = [
    datetime(2026, 12, 4, 1, 2, 3, 456789, tzinfo=UTC),
    datetime(2026, 12, 4, 1, 2, 3),
    date(2026, 12, 4),
    time(1, 2, 3),
    Decimal("1.50"),
    uuid.UUID("6f1d7c4e-3b57-4a8e-9a54-3c1f0e1d2b77"),
    b"bytes",
    b"\xff\x00",
]


def test_kombus_json_types_come_back_as_celerys_json_serializer_gives_them() -> None:
    value = {"args": [*KOMBU_TYPES, (1, 2)], "kwargs": {"nested": {"when": KOMBU_TYPES[0]}}}
    kept = stored(value)
    # What the journal's JSON column keeps is plain JSON: kombu's encoded form.
    assert json.loads(json.dumps(kept)) == kept
    assert decoded(kept) == kombu_json.loads(kombu_json.dumps(value))
    assert [type(v) for v in decoded(kept)["args"]] == [*map(type, KOMBU_TYPES), list]


def test_plain_json_is_kept_as_it_is_and_a_known_marker_reads_as_celery_reads_it() -> None:
    plain = {"args": [1, "a", None], "kwargs": {"x": [1.5]}}
    assert stored(plain) is plain
    marker = {"__type__": "decimal", "__value__": "2.5"}
    assert decoded(stored([marker])) == kombu_json.loads(kombu_json.dumps([marker]))


def test_a_result_of_a_kombu_type_is_kept_encoded_and_its_size_counted_so() -> None:
    kept = checked("t", Decimal("1.5"), 100)
    assert kept == {"__type__": "decimal", "__value__": "1.5"}
    assert decoded(kept) == Decimal("1.5")
    with pytest.raises(ResultRefused, match="returned 40 bytes of JSON"):
        checked("t", Decimal("1.5"), 39)
