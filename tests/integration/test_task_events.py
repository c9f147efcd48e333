"""A pool child's task-started events (lifecycle/worker/celery_view.py ``send_started``), on
the real Redis: held for at most ``EVENTS_WINDOW`` and published together in Celery's
``task.multi`` messages, as Celery's worker publishes its own task events; every event
arrives, and a lone one is not held for company."""

from __future__ import annotations

import contextlib
import itertools
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.events.receiver import EventReceiver

from jobsapp.lifecycle.worker import celery_view
from tests.support.env import SESSION, service

_hosts = itertools.count()


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("events-tests", broker=service("JOBSAPP_TEST_REDIS_URL"), set_as_current=False)
    yield app
    app.close()


Batch = tuple[str, list[dict[str, Any]]]


class Watch(EventReceiver):
    """Celery's event receiver, as Flower runs it, keeping the (routing key, events) of
    each message it takes apart."""

    def __init__(self, app: Celery, conn: Any) -> None:
        super().__init__(conn, handlers={"*": lambda _event: None}, app=app)
        self.got: list[Batch] = []

    def _receive(self, body: Any, message: Any, *args: Any, **kwargs: Any) -> None:
        events = body if isinstance(body, list) else [body]
        self.got.append((message.delivery_info.get("routing_key", ""), events))
        super()._receive(body, message, *args, **kwargs)

    def listening(self) -> Any:
        """The receiver's own consumer (``get_consumers``), consuming."""
        (consumer,) = self.get_consumers(self.connection.Consumer, self.connection.default_channel)
        return consumer

    def drain(self) -> None:
        with contextlib.suppress(socket.timeout):
            self.connection.drain_events(timeout=0.1)

    def of(self, host: str) -> list[Batch]:
        found = [
            (key, [e for e in events if e.get("hostname") == host]) for key, events in self.got
        ]
        return [(key, events) for key, events in found if events]

    def until(self, host: str, count: int) -> list[Batch]:
        """The messages of ``host`` once ``count`` of its events came (5 s at most)."""
        deadline = time.monotonic() + 5.0
        while sum(len(e) for _, e in self.of(host)) < count and time.monotonic() < deadline:
            self.drain()
        return self.of(host)


@pytest.fixture
def watched(app: Celery) -> Iterator[Watch]:
    """A receiver of Celery's events (on Redis a pub/sub channel: only a subscribed
    receiver hears an event), subscribed before the test: it heard a probe."""
    with app.connection_for_read() as conn:
        watch = Watch(app, conn)
        with watch.listening():
            probe = app.events.Dispatcher(
                app.connection_for_write(),
                hostname=f"probe-{SESSION}@here",
                buffer_while_offline=False,
            )
            deadline = time.monotonic() + 10.0
            while not watch.got and time.monotonic() < deadline:
                probe.send("worker-probe", retry=False)
                watch.drain()
            probe.close()
            assert watch.got, "the event receiver never heard a probe"
            yield watch


def _host() -> str:
    # A dispatcher is kept per process and worker name: each test starts with a new one.
    return f"events-{SESSION}-{next(_hosts)}@here"


def test_started_events_of_quick_jobs_go_out_together_and_every_one_arrives(
    app: Celery, watched: Watch
) -> None:
    host = _host()
    ids = [f"{SESSION}-job-{i}" for i in range(30)]

    for task_id in ids:
        celery_view.send_started(app, task_id, host, {"args": "()", "kwargs": "{}"})
    messages = watched.until(host, len(ids))

    events = [event for _, batch in messages for event in batch]
    assert sorted(e["uuid"] for e in events) == sorted(ids)
    assert {e["type"] for e in events} == {"task-started"}
    assert {e["hostname"] for e in events} == {host}
    # 24 to a message (Celery's buffer limit), the rest within the window: not one each.
    assert len(messages) <= 2, [(key, len(batch)) for key, batch in messages]
    assert {key for key, _ in messages} == {"task.multi"}


def test_a_lone_started_event_is_published_without_waiting_for_more(
    app: Celery, watched: Watch
) -> None:
    host = _host()

    celery_view.send_started(app, f"{SESSION}-alone", host, {"args": "()", "kwargs": "{}"})
    messages = watched.until(host, 1)

    assert [e["uuid"] for _, batch in messages for e in batch] == [f"{SESSION}-alone"]
