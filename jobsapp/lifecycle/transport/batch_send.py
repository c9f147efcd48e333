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
``send_task`` itself.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from celery import Celery, signals
from celery.utils.quorum_queues import detect_quorum_queues
from kombu import Queue


def publish_watched() -> bool:
    """Whether anything sees a publish besides the broker: a receiver of Celery's publish
    signals (OpenTelemetry's instrumentation) reads the current trace context."""
    return bool(signals.before_task_publish.receivers or signals.after_task_publish.receivers)


class BatchSender:
    """``send_task`` (the arguments the outbox passes) for the publishes of one batch."""

    def __init__(self, app: Celery, producer: Any) -> None:
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
        self._parent = app.current_worker_task
        self._tasks: dict[str, tuple[Any, dict[str, Any]]] = {}
        # By identity, each with its own copy held so that its id is not reused.
        self._queues: dict[int, tuple[Queue, Queue]] = {}
        self._dispatcher = self._bound_dispatcher() if self._sent_event else None
        self.watched = publish_watched()

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
                **options,
            )
            return
        if exec_options:
            options = dict(exec_options, **options)
        time_limit = options.pop("time_limit", None)
        soft_time_limit = options.pop("soft_time_limit", None)
        ignore_result = options.pop("ignore_result", None)
        options = self._router.route(options, name, args, kwargs, task_type)
        root_id, parent_id = self._lineage(options, root_id, parent_id)
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
        self._publish(name, task_id, message, ignore_result, options)

    def _publish(
        self,
        name: str,
        task_id: str,
        message: Any,
        ignore_result: bool | None,
        options: dict[str, Any],
    ) -> None:
        producer = self._producer
        queue = options.get("queue")
        if isinstance(queue, Queue):
            options["queue"] = self._bound(queue)
        with producer.connection._reraise_as_library_errors():
            if not ignore_result:
                self._app.backend.on_task_call(producer, task_id)
            self._send_message(
                producer, name, message, event_dispatcher=self._dispatcher, **options
            )
        if self._parent is not None:
            self._parent.add_trail(self._app.AsyncResult(task_id))

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
