"""The W3C carrier a request or message hands on: malformed fields never travel."""

from __future__ import annotations

import pytest

from jobsapp.lifecycle.transport.tracing import carrier_from

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


def test_without_a_tracer_provider_a_run_opens_no_span_yet_hands_its_trace_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opentelemetry import trace

    from jobsapp.lifecycle.transport import tracing

    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    with tracing.span("run x", {"traceparent": TRACEPARENT}, consumer=True):
        # No OpenTelemetry call on the way in (the no-op path costs a context variable)...
        assert not trace.get_current_span().get_span_context().is_valid
        # ...and what an enqueue or a log line inside reads is still the run's trace.
        assert tracing.outgoing() == {"traceparent": TRACEPARENT}
        assert tracing.current_trace_id() == TRACEPARENT[3:35]
