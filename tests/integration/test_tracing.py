"""Trace context end to end, seen through the OpenTelemetry SDK's in-memory exporter.

The upload's incoming ``traceparent`` is the ancestor of the worker's run span, also
when the relay in beat publishes the message under a trace of its own; with and without
``opentelemetry-instrumentation-celery``.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from celery.contrib.testing.worker import TestWorkController
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import Engine

from jobsapp.attachments.tasks import TASK_NAME
from jobsapp.celery_app import app
from jobsapp.maintenance import relay
from jobsapp.settings import get_settings
from jobsapp.storage import ObjectStore
from jobsapp.web.app import create_app
from tests.support import tasks
from tests.support.attachments import settled
from tests.support.databases import use_database
from tests.support.waiting import eventually
from tests.unit import images

PRODUCERS_TOKEN = "tracing-producers-token-5c8e1a7f3d9b"

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def _provider() -> Iterator[None]:
    """The SDK as an application would install it; the global provider is set once."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)
    yield
    # The provider stays for the session: later tests' spans are dropped, not kept.
    _EXPORTER.shutdown()


@pytest.fixture(params=["plain", "celery-instrumented"])
def spans(request: pytest.FixtureRequest) -> Iterator[InMemorySpanExporter]:
    instrumentor = CeleryInstrumentor()
    if request.param == "celery-instrumented":
        instrumentor.instrument()
    _EXPORTER.clear()
    try:
        yield _EXPORTER
    finally:
        if request.param == "celery-instrumented":
            instrumentor.uninstrument()


@pytest.fixture
def db(postgres_url: str) -> Engine:
    return use_database(postgres_url)


def _run_span(exporter: InMemorySpanExporter, task_name: str) -> ReadableSpan:
    def probe() -> ReadableSpan | None:
        return next(
            (s for s in exporter.get_finished_spans() if s.name == f"run {task_name}"), None
        )

    return eventually(probe, timeout=30)


def _ancestors(span: ReadableSpan, exporter: InMemorySpanExporter) -> list[str]:
    """Span ids from ``span``'s parent up to the root (the remote caller's, last)."""
    by_id = {s.context.span_id: s for s in exporter.get_finished_spans() if s.context}
    chain: list[str] = []
    parent = span.parent
    while parent is not None:
        chain.append(format(parent.span_id, "016x"))
        above = by_id.get(parent.span_id)
        parent = above.parent if above is not None else None
    return chain


def _names(span_ids: list[str], exporter: InMemorySpanExporter) -> list[str]:
    by_id = {
        format(s.context.span_id, "016x"): s.name
        for s in exporter.get_finished_spans()
        if s.context
    }
    return [by_id.get(i, "(remote caller)") for i in span_ids]


def test_an_uploads_traceparent_is_the_ancestor_of_the_workers_span(
    spans: InMemorySpanExporter,
    s3: ObjectStore,
    worker: TestWorkController,
    db: Engine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JOBSAPP_API_TOKEN", PRODUCERS_TOKEN)
    get_settings.cache_clear()
    client = create_app().test_client()
    answer = client.post(
        "/v1/attachments",
        data={"file": (io.BytesIO(images.png_with_alpha()), "photo.png")},
        headers={"traceparent": TRACEPARENT, "Authorization": f"Bearer {PRODUCERS_TOKEN}"},
    )
    get_settings.cache_clear()
    assert answer.status_code == 202
    settled(uuid.UUID(answer.get_json()["id"]), "ready")
    run = _run_span(spans, TASK_NAME)
    assert run.context is not None
    assert format(run.context.trace_id, "032x") == TRACE_ID
    chain = _ancestors(run, spans)
    assert chain[-1] == CALLER_SPAN
    assert "upload" in _names(chain, spans)


def test_the_relay_publishes_in_the_producers_trace_not_its_own(
    spans: InMemorySpanExporter, worker: TestWorkController, db: Engine
) -> None:
    token = f"relayed-{uuid.uuid4().hex[:8]}"
    # A Core connection has no after-commit hook: only the relay publishes this message.
    with db.begin() as conn:
        tasks.echo.apply_async((token,), connection=conn, headers={"traceparent": TRACEPARENT})
    tracer = trace.get_tracer("beat")
    with tracer.start_as_current_span("beat tick") as tick:
        counts = relay.run_once(app, db, relay.RelayConfig(grace=timedelta(0)))
    assert counts["published"] == 1
    run = _run_span(spans, "tests.echo")
    assert run.context is not None
    assert format(run.context.trace_id, "032x") == TRACE_ID
    assert _ancestors(run, spans)[-1] == CALLER_SPAN
    beat_trace = tick.get_span_context().trace_id
    assert not [
        s.name
        for s in spans.get_finished_spans()
        if s.context and s.context.trace_id == beat_trace and s.name != "beat tick"
    ]
    assert tasks.calls(token) == 1


def test_the_relay_publishes_a_batch_each_message_in_its_producers_trace(
    spans: InMemorySpanExporter, worker: TestWorkController, db: Engine
) -> None:
    """Several rows in one publish batch (``batch_send``): each message is published under
    the context stored with it, not the previous message's and not beat's."""
    traces = {f"relayed-{uuid.uuid4().hex[:8]}": uuid.uuid4().hex for _ in range(3)}
    with db.begin() as conn:
        for token, trace_id in traces.items():
            parent = f"00-{trace_id}-{CALLER_SPAN}-01"
            tasks.echo.apply_async((token,), connection=conn, headers={"traceparent": parent})
    tracer = trace.get_tracer("beat")
    with tracer.start_as_current_span("beat tick") as tick:
        counts = relay.run_once(app, db, relay.RelayConfig(grace=timedelta(0)))
    assert counts["published"] == len(traces)
    for token, trace_id in traces.items():
        eventually(lambda token=token: tasks.calls(token) == 1, timeout=30)
        runs = eventually(
            lambda trace_id=trace_id: [
                s
                for s in spans.get_finished_spans()
                if s.name == "run tests.echo"
                and s.context
                and format(s.context.trace_id, "032x") == trace_id
            ]
        )
        assert _ancestors(runs[0], spans)[-1] == CALLER_SPAN
    beat_trace = tick.get_span_context().trace_id
    assert not [
        s.name
        for s in spans.get_finished_spans()
        if s.context and s.context.trace_id == beat_trace and s.name != "beat tick"
    ]
