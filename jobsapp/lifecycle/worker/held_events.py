"""The worker's own task events held for at most ``EVENTS_WINDOW`` and published together.

Celery's consumer holds each task event (received, succeeded, failed, retried, ...) in its
dispatcher's ``task`` group and asks its event loop to publish the group at the loop's next
turn (``Consumer.on_send_event_buffered``). At a few hundred jobs a second a turn holds one
or two events, so each still goes out as a publish of its own: with task events on, bare
Celery's worker spends about half again its CPU a job on them. This consumer step, after
Celery's ``Events``, asks for that publish ``EVENTS_WINDOW`` after the first held event
instead, as the pool child holds its task-started events (``celery_view``): up to 24 go out
in one ``task.multi`` message (Celery's limit, checked here), which Celery's receivers and
Flower take apart.

Two windows, the worker's and the pool child's, publish a job's task-received and its
task-started in either order. Flower (Celery's ``events.state``) keeps the arguments of a
task-received heard after a task-started, and a lifecycle task's task-started carries the
user's call while its message (and so its task-received) carries jobsapp's envelope; so the
task-received of a lifecycle task leaves its arguments out. Flower shows the envelope
from the producer's task-sent until the task-started comes, as before from the
task-received; the task-received of any other task is left as Celery sends it.

Flower hears of a job up to ``EVENTS_WINDOW`` later. A warm shutdown loses none: Celery's
close of the dispatcher would drop what it holds, so the consumer's shutdown publishes it
first (tests/e2e/test_worker_events.py; with a 10 s window the test fails without it). What
is held when the broker connection is lost goes with the old dispatcher, as every event
published meanwhile does: the receivers (Flower) lost their subscription too. Pools
without Celery's event loop (threads, eventlet, gevent) publish each event at once, as in
Celery; the prefork and solo pools on Redis or RabbitMQ have it.
"""

from __future__ import annotations

import sys
from typing import Any, Final

from celery import bootsteps

from jobsapp.lifecycle.worker.celery_view import EVENTS_WINDOW, started_shows_call

# Celery's own limit: the most events one ``task.multi`` message carries.
MOST_IN_ONE: Final = 24


class HeldTaskEvents(bootsteps.StartStopStep):
    """Publishes the consumer's held task events ``EVENTS_WINDOW`` after the first of them."""

    requires = ("celery.worker.consumer.events:Events",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._armed = False
        self._withheld: dict[str, bool] = {}

    def start(self, c: Any) -> None:
        dispatcher = c.event_dispatcher
        if c.hub is None or dispatcher is None or dispatcher.on_send_buffered is None:
            return
        # A restart may have dropped the event loop's timers with a window armed.
        self._armed = False
        self._withheld.clear()  # the tasks as registered now
        # Every held event passes through ``_held``: Celery's own check of its limit would
        # publish the last one without it.
        dispatcher.buffer_limit = sys.maxsize
        dispatcher.on_send_buffered = lambda: self._held(c, dispatcher)

    def _held(self, c: Any, dispatcher: Any) -> None:
        held = dispatcher._group_buffer["task"]  # Celery gives no other view of it
        newest = held[-1]
        if newest["type"] == "task-received" and self._withholds(c, newest["name"]):
            newest.pop("args", None)
            newest.pop("kwargs", None)
        if len(held) >= MOST_IN_ONE:
            dispatcher.flush()
        elif not self._armed:
            self._armed = True
            c.hub.call_later(EVENTS_WINDOW, self._publish, c)

    def _withholds(self, c: Any, name: str) -> bool:
        found = self._withheld.get(name)
        if found is None:
            found = self._withheld[name] = started_shows_call(c.app, name)
        return found

    def _publish(self, c: Any) -> None:
        # Disarmed first: an event held during the publish arms the next window.
        self._armed = False
        if c.event_dispatcher is not None:
            c.event_dispatcher.flush()

    def shutdown(self, c: Any) -> None:
        # Celery's own close of the dispatcher, next, would drop what it holds.
        self._publish(c)
