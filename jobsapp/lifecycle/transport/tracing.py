"""W3C trace context from the upload to the worker, through any number of republishes.

A job's trace context is decided once, when it is enqueued, and stored in the outbox
body (``traceparent``, ``tracestate``). Every publish of that row (the producer's fast
path, the relay's republish) runs under the stored context, so a publish span that
``opentelemetry-instrumentation-celery`` opens, and the headers it injects, belong to
the producer's trace, not to beat's. The worker's run span continues the same context.

OpenTelemetry is optional: without ``opentelemetry-api`` installed, an incoming
``traceparent`` is still stored and sent in the headers; only spans are missing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from importlib.util import find_spec
from typing import Any

from jobsapp.lifecycle.rules.message import TRACE_HEADERS

_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_TRACESTATE_MAX = 512
HAS_OTEL = find_spec("opentelemetry") is not None
TRACER_NAME = "jobsapp"

Carrier = dict[str, str]

# The incoming context of the request or run being served, for enqueues made within it
# when OpenTelemetry is absent (with it, the current span says the same).
_incoming: ContextVar[Carrier | None] = ContextVar("jobsapp_trace", default=None)


def carrier_from(headers: Mapping[str, Any]) -> Carrier:
    """The W3C fields of ``headers`` that are well formed; an invalid one is dropped."""
    parent = headers.get("traceparent")
    if not isinstance(parent, str) or not _TRACEPARENT.fullmatch(parent):
        return {}
    carrier = {"traceparent": parent}
    state = headers.get("tracestate")
    if isinstance(state, str) and 0 < len(state) <= _TRACESTATE_MAX and state.isprintable():
        carrier["tracestate"] = state
    return carrier


def outgoing() -> Carrier:
    """The context a job enqueued now should carry: the current span's, else the
    incoming request's; empty when there is none (the message then starts a trace)."""
    if HAS_OTEL:
        carrier = _current_span_carrier()
        if carrier:
            return carrier
    return dict(_incoming.get() or {})


@contextmanager
def span(
    name: str,
    headers: Mapping[str, Any],
    *,
    consumer: bool,
    attributes: Mapping[str, str | int] | None = None,
) -> Iterator[None]:
    """A span named ``name`` that continues ``headers``' context.

    A span already current (Flask or Celery instrumentation) is the better parent: it is
    itself a child of the same incoming context. Enqueues inside get this span's context.
    """
    carrier = carrier_from(headers)
    token = _incoming.set(carrier or None)
    try:
        if HAS_OTEL and recording():
            with _otel_span(name, carrier, consumer, dict(attributes or {})):
                yield
        else:
            yield
    finally:
        _incoming.reset(token)


def recording() -> bool:
    """A tracer provider is configured: without one every span is a no-op, and the
    incoming context (``_incoming``) already gives enqueues and logs the same trace."""
    from opentelemetry import trace

    return not isinstance(
        trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    )


@contextmanager
def publishing(body: Mapping[str, Any]) -> Iterator[None]:
    """Run a publish under the context stored with the message, not the caller's.

    The relay in beat would otherwise parent the instrumentation's publish span, and the
    headers it injects, on beat's own context: a new trace per republish.
    """
    if not HAS_OTEL:
        yield
        return
    from opentelemetry import context, propagate

    carrier = {k: str(body[k]) for k in TRACE_HEADERS if k in body}
    token = context.attach(propagate.extract(carrier, context=context.Context()))
    try:
        yield
    finally:
        context.detach(token)


def current_trace_id() -> str | None:
    """The trace id of the current span, else of the context being served (for logs)."""
    if HAS_OTEL:
        from opentelemetry import trace

        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            return format(ctx.trace_id, "032x")
    parent = (_incoming.get() or {}).get("traceparent")
    return parent[3:35] if parent else None


def _current_span_carrier() -> Carrier:
    from opentelemetry import propagate, trace

    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: Carrier = {}
    propagate.inject(carrier)
    return carrier_from(carrier)


@contextmanager
def _otel_span(
    name: str, carrier: Carrier, consumer: bool, attributes: dict[str, str | int]
) -> Iterator[None]:
    from opentelemetry import context, propagate, trace

    parent = (
        None
        if trace.get_current_span().get_span_context().is_valid
        else (propagate.extract(carrier, context=context.Context()))
    )
    kind = trace.SpanKind.CONSUMER if consumer else trace.SpanKind.SERVER
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(name, context=parent, kind=kind, attributes=attributes):
        yield
