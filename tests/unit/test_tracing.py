"""The W3C carrier a request or message hands on: malformed fields never travel."""

from __future__ import annotations

import pytest

from jobsapp.lifecycle.tracing import carrier_from

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_well_formed_context_is_kept_whole() -> None:
    headers = {"traceparent": TRACEPARENT, "tracestate": "rojo=00f067aa0ba902b7"}
    assert carrier_from(headers) == headers


@pytest.mark.parametrize(
    "traceparent",
    ["", "00-xyz", TRACEPARENT.upper(), TRACEPARENT + "\n", f"01-{TRACEPARENT[3:]}-extra", 7],
)
def test_a_malformed_traceparent_is_dropped_with_its_tracestate(traceparent: object) -> None:
    assert carrier_from({"traceparent": traceparent, "tracestate": "rojo=1"}) == {}


@pytest.mark.parametrize("tracestate", ["", "a=" + "b" * 600, "rojo=1\nx=2"])
def test_a_bad_tracestate_is_dropped_and_the_traceparent_kept(tracestate: str) -> None:
    assert carrier_from({"traceparent": TRACEPARENT, "tracestate": tracestate}) == {
        "traceparent": TRACEPARENT
    }
