"""Celery's ``send_task`` for the many messages of one publish batch, per batch where it can.

``app.send_task`` is mostly not the message: per call it finds the task and its options,
looks up the worker task it runs under, takes a producer, builds an ``AsyncResult``; and
kombu, to see that the queue and the event exchange are declared, binds a copy of each
(a queue copies its exchange and bindings) for every message and its sent event. A
batch sends many messages on one producer and channel from one thread: here the task's
options are found once per task, the worker task once per batch, the queue is bound once
per batch and the sent events go through one event dispatcher whose exchange is bound once.

The messages themselves are still Celery's: the router routes each one, Celery's
``create_task_message`` builds it, its ``send_task_message`` fires the publish signals,
publishes it through kombu. Its task-sent event is Celery's too, but sent as Celery's
worker sends its own task events: held, and published in lists of up to 24 (routing key
``task.multi``, which Celery's event receivers and Flower take apart) when the batch
ends, instead of one publish per event: the events were half of the batch's publishes.
tests/integration/test_batch_publish.py checks that a batch puts on the broker what
``send_task`` puts there for the same jobs one by one (the same events, in lists). A
message Celery rewrites per call (a task with a default expiry; a countdown towards
RabbitMQ's quorum queues, which is routed to its delayed-delivery exchange) goes through
``send_task`` itself. Of the messages of one shape (task and options) after the first,
each is a copy of the first with its own values (``message_template``), where nothing
could route or build one differently: no publish signal receivers, Celery's own message
builder, routes that read only the task's name.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import Any

from celery import Celery, signals
from celery.app.amqp import AMQP
from celery.app.routes import MapRoute
from celery.utils.quorum_queues import detect_quorum_queues
from kombu import Queue

from jobsapp.lifecycle.transport.message_template import Call, Template

# Options that are a call's own: not part of its message's shape.
_PER_CALL_OPTIONS = frozenset({"argsrepr", "kwargsrepr", "headers"})


def publish_watched() -> bool:
    """Whether anything sees a publish besides the broker: a receiver of Celery's publish
    signals (OpenTelemetry's instrumentation) reads the current trace context."""
    return bool(signals.before_task_publish.receivers or signals.after_task_publish.receivers)


class BatchSender:
    """``send_task`` (the arguments the outbox passes) for the publishes of one batch."""

    def __init__(self, app: Celery, producer: Any, *, by_running_task: bool = True) -> None:
        self._app = app
        amqp = app.amqp
        self._router = amqp.router
        self._create_message = amqp.create_task_message
        self._send_message = amqp.send_task_message
        self._producer = producer
        self._channel = producer.channel
        conf = app.conf
        self._sent_event = bool(conf.task_send_sent_event)
        self._inherit_priority = bool(conf.task_inherit_parent_priority)
        self._reply_to = app.thread_oid
        # The task whose body sends the messages, as send_task takes it; None for messages
        # a worker publishes on other callers' behalf (a key's next run granted its slot).
        self._parent = app.current_worker_task if by_running_task else None
        self._tasks: dict[str, tuple[Any, dict[str, Any]]] = {}
        # By identity, each with its own copy held so that its id is not reused.
        self._queues: dict[int, tuple[Queue, Queue]] = {}
        self._dispatcher = self._bound_dispatcher() if self._sent_event else None
        self.watched = publish_watched()
        # shape -> its template; None for a shape whose messages each go through Celery.
        self._templates: dict[Hashable, Template | None] = {}
        self._copying = self._copies_are_celerys()

    def send_task(
        self,
        name: str,
        *,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        task_id: str,
        retries: int = 0,
        root_id: str | None = None,
        parent_id: str | None = None,
        countdown: float | None = None,
        producer: Any = None,  # noqa: ARG002 - the batch's, which the caller names as for send_task
        add_to_parent: bool = False,  # noqa: ARG002 - an attempt's message trails nothing (_sending)
        **options: Any,
    ) -> None:
        """What ``app.send_task`` does with these arguments, on the batch's producer."""
        task_type, exec_options = self._task(name)
        if exec_options.get("expires") is not None or (countdown and self._quorum):
            self._app.send_task(
                name,
                args=args,
                kwargs=kwargs,
                task_id=task_id,
                retries=retries,
                root_id=root_id,
                parent_id=parent_id,
                countdown=countdown,
                producer=self._producer,
                add_to_parent=False,
                **options,
            )
            return
        if exec_options:
            options = dict(exec_options, **options)
        shape = self._shape(name, countdown, options)
        template = None if shape is None else self._templates.get(shape)
        if template is not None:
            root_id, parent_id = self._lineage(options, root_id, parent_id)
            call = _call(task_id, args, kwargs, retries, root_id, parent_id, options)
            self._send_copy(template, call)
            return
        if shape in self._templates:  # a shape whose messages each go through Celery
            shape = None
        lineage = (root_id, parent_id)
        self._send_built(
            name, task_type, task_id, args, kwargs, retries, lineage, countdown, options, shape
        )

    def _send_built(
        self,
        name: str,
        task_type: Any,
        task_id: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        retries: int,
        lineage: tuple[str | None, str | None],
        countdown: float | None,
        options: dict[str, Any],
        shape: Hashable | None,
    ) -> None:
        """Route, build and publish the message as ``send_task`` does; the first of a
        ``shape`` also leaves its template."""
        time_limit = options.pop("time_limit", None)
        soft_time_limit = options.pop("soft_time_limit", None)
        ignore_result = options.pop("ignore_result", None)
        options = self._router.route(options, name, args, kwargs, task_type)
        root_id, parent_id = self._lineage(options, *lineage)
        message = self._create_message(
            task_id,
            name,
            args,
            kwargs,
            countdown=countdown,
            retries=retries,
            reply_to=self._reply_to,
            time_limit=time_limit,
            soft_time_limit=soft_time_limit,
            create_sent_event=self._sent_event,
            root_id=root_id,
            parent_id=parent_id,
            ignore_result=ignore_result,
            **options,
        )
        if shape is None:
            self._publish(name, message, options)
            return
        call = _call(task_id, args, kwargs, retries, root_id, parent_id, options)
        self._templates[shape] = self._publish_first(name, call, message, options)

    def _publish(
        self,
        name: str,
        message: Any,
        options: dict[str, Any],
        *,
        producer: Any = None,
        dispatcher: Any = None,
    ) -> None:
        """``send_task_message`` of ``message`` (through ``producer`` and ``dispatcher``
        if given: the recorders of a shape's first message)."""
        queue = options.get("queue")
        if isinstance(queue, Queue):
            options["queue"] = self._bound(queue)
        with self._sending():
            self._send_message(
                producer or self._producer,
                name,
                message,
                event_dispatcher=dispatcher or self._dispatcher,
                **options,
            )

    def _publish_first(
        self,
        name: str,
        call: Call,
        message: Any,
        options: dict[str, Any],
    ) -> Template | None:
        """Publish the first message of a shape through Celery; its template, if copies
        of it would be what Celery sends."""
        producer = _Recorded(self._producer)
        dispatcher = None if self._dispatcher is None else _Recorded(self._dispatcher)
        self._publish(name, message, options, producer=producer, dispatcher=dispatcher)
        events = [] if dispatcher is None else dispatcher.calls
        if len(producer.calls) != 1 or len(events) > 1:
            return None
        (body,), publish = producer.calls[0]
        event = None
        if events:
            (kind, fields, _), _ = events[0]
            if kind != "task-sent":
                return None
            event = dict(fields)
        return Template.of(call, body, dict(publish), event)

    def _send_copy(self, template: Template, call: Call) -> None:
        """What ``_publish`` sends for ``call``, as a copy of its shape's first message."""
        body, publish = template.message(call)
        event = template.sent_event(call)
        with self._sending():
            self._producer.publish(body, **publish)
            if event is not None and self._dispatcher is not None:
                self._dispatcher.publish("task-sent", event, self._producer)

    @contextmanager
    def _sending(self) -> Iterator[None]:
        """What ``send_task`` does around a message's publish: a broker's errors raised as
        kombu's. No result backend is told of the call (``on_task_call``): a lifecycle
        job's result is the journal's, and a backend that listens for results (Redis's, a
        deployment's under the journal) would subscribe to one per message, never to hear
        it. Nor is the calling task's trail extended: a call joins its sender's children
        when it is enqueued (``LifecycleTask.apply_async``), and a message is an attempt."""
        with self._producer.connection._reraise_as_library_errors():
            yield

    def _copies_are_celerys(self) -> bool:
        """Whether a copy of a shape's first message is what Celery would build and route
        for the next: nothing watches a publish (signal receivers see each message), the
        app builds messages with Celery's own protocol 2 builder, its routes read only
        a task's name, and no inherited priority varies with the calling task."""
        app = self._app
        return (
            not self.watched
            and not signals.task_sent.receivers
            and type(app.amqp) is AMQP
            and app.conf.task_protocol == 2
            and all(isinstance(route, MapRoute) for route in self._router.routes)  # type: ignore[attr-defined]
            and not (self._parent is not None and self._inherit_priority)
        )

    def _shape(
        self, name: str, countdown: float | None, options: dict[str, Any]
    ) -> Hashable | None:
        """What a message's construction depends on besides its call's own values; None
        for a message Celery builds from the call (a countdown's eta, a repr it makes)."""
        if not self._copying or countdown:
            return None
        if options.get("argsrepr") is None or options.get("kwargsrepr") is None:
            return None
        headers = options.get("headers") or {}
        try:
            # By type too: 30 and 30.0 are equal, but a time limit is sent as either.
            own = (kv for kv in options.items() if kv[0] not in _PER_CALL_OPTIONS)
            return name, frozenset((k, type(v), v) for k, v in own), frozenset(headers)
        except TypeError:  # an option with no hash (Celery's stamped_headers list)
            return None

    def _task(self, name: str) -> tuple[Any, dict[str, Any]]:
        """The registered task of ``name`` (None for one only a worker knows) and the
        options it sets, as ``send_task`` merges them."""
        found = self._tasks.get(name)
        if found is None:
            # The registry as it is, as send_task reads it: no finalize for a lookup.
            task_type = self._app._tasks.get(name)  # type: ignore[attr-defined]
            options = task_type._get_exec_options() if task_type is not None else {}
            found = self._tasks[name] = (
                task_type,
                {k: v for k, v in options.items() if v is not None},
            )
        return found

    def _lineage(
        self, options: dict[str, Any], root_id: str | None, parent_id: str | None
    ) -> tuple[str | None, str | None]:
        """A message sent from inside a worker task descends from it, as in ``send_task``."""
        parent = self._parent
        if parent is None or (root_id and parent_id):
            return root_id, parent_id
        request = parent.request
        if self._inherit_priority:
            options.setdefault("priority", (request.delivery_info or {}).get("priority"))
        return root_id or request.root_id or request.id, parent_id or request.id

    @cached_property
    def _quorum(self) -> bool:
        """Whether the app's queues are quorum queues (no countdown there): once a batch."""
        driver_type = self._producer.connection.transport.driver_type
        return bool(detect_quorum_queues(self._app, driver_type)[0])

    def _bound(self, queue: Queue) -> Queue:
        """``queue`` bound to the batch's channel: kombu's declare check then finds it bound
        and declared instead of binding a copy per message."""
        known = self._queues.get(id(queue))
        if known is None:
            known = self._queues[id(queue)] = (queue, queue.bind(self._channel))
        return known[1]

    def flush_events(self) -> None:
        """Publish the task-sent events still held (before the batch's round trip ends)."""
        if self._dispatcher is not None:
            self._dispatcher.flush(errors=False)

    def _bound_dispatcher(self) -> Any:
        """An event dispatcher like Celery's worker's, its exchange bound to the batch's
        channel, publishing through the batch's producer; ``send_task_message`` hands it
        each task-sent event (``_HeldEvents``), the batch's end flushes them."""
        dispatcher = self._app.events.Dispatcher(channel=self._channel, buffer_group=["task"])
        dispatcher.exchange = dispatcher.exchange.bind(self._channel)
        if not dispatcher.enabled:  # a transport Celery sends no events through
            return None
        dispatcher.publisher = self._producer
        return _HeldEvents(dispatcher)


class _HeldEvents:
    """What ``send_task_message`` publishes a task-sent event through: Celery's dispatcher,
    whose ``send`` holds a task event and publishes the held ones as a list."""

    def __init__(self, dispatcher: Any) -> None:
        self._dispatcher = dispatcher

    def publish(self, type: str, fields: dict[str, Any], producer: Any, **_retry: Any) -> None:
        del producer  # the dispatcher's own: the batch's
        self._dispatcher.send(type, **fields)

    def flush(self, *, errors: bool) -> None:
        self._dispatcher.flush(errors=errors)


def _call(
    task_id: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    retries: int,
    root_id: str | None,
    parent_id: str | None,
    options: dict[str, Any],
) -> Call:
    return Call(
        task_id,
        args,
        kwargs,
        retries,
        root_id,
        parent_id,
        options["argsrepr"],
        options["kwargsrepr"],
        options.get("headers") or {},
    )


class _Recorded:
    """``target`` whose ``publish`` calls are kept: what Celery handed kombu (a producer)
    or the event dispatcher for a shape's first message."""

    def __init__(self, target: Any) -> None:
        self._target = target
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def publish(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, dict(kwargs)))
        return self._target.publish(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)
