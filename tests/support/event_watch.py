"""Celery's event receiver, as Flower runs it, keeping every message it takes apart."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

from celery import Celery
from celery.events.receiver import EventReceiver

# The routing key of a message and the events it carried (one, or a ``task.multi`` list).
Batch = tuple[str, list[dict[str, Any]]]


class Watch(EventReceiver):
    """Celery's event receiver, keeping the (routing key, events) of each message."""

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

    def until(self, host: str, count: int, timeout: float = 5.0) -> list[Batch]:
        """The messages of ``host`` once ``count`` of its events came (``timeout`` at most)."""
        deadline = time.monotonic() + timeout
        while sum(len(e) for _, e in self.of(host)) < count and time.monotonic() < deadline:
            self.drain()
        return self.of(host)


@contextlib.contextmanager
def watching(app: Celery, probe_host: str) -> Iterator[Watch]:
    """A receiver of ``app``'s events (on Redis a pub/sub channel: only a subscribed
    receiver hears an event), subscribed before it is yielded: it heard a probe."""
    with app.connection_for_read() as conn:
        watch = Watch(app, conn)
        with watch.listening():
            probe = app.events.Dispatcher(
                app.connection_for_write(), hostname=probe_host, buffer_while_offline=False
            )
            deadline = time.monotonic() + 10.0
            while not watch.got and time.monotonic() < deadline:
                probe.send("worker-probe", retry=False)
                watch.drain()
            probe.close()
            assert watch.got, "the event receiver never heard a probe"
            yield watch
