"""No message stops a worker: every delivery is checked before Celery's consumer reads it.

Celery's ``on_task_received`` looks the strategy up by the ``task`` header and builds a
Request from the other headers; a fault there raises inside the consumer's event loop, so
the worker exits (RabbitMQ) or reconnects and meets the message again (Redis), and a
supervisor's restart only repeats it. The worker's consumer class (``worker_consumer``) wraps
that handler: a message whose headers or body are unusable, or that makes Celery's own
handling raise, is rejected without requeue and logged once, as

    rejected message <id> for <task>: <reason>

the same form the tasks use for bodies that break the job contract. A sound message for a
task no worker here registered goes to Celery's own handler of unknown tasks once the journal
keeps its failure (``unregistered``), or is refused so when the journal already answers for
it (jobsapp's own message of a task an older worker does not know). On RabbitMQ a reject
without requeue goes to the queue's dead-letter exchange when a policy sets one (see
``DEAD_LETTERS`` and docs/reliability.md); on Redis the log line is the record.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, Final

from celery import bootsteps
from celery.worker.consumer import Consumer
from kombu import Exchange, Queue

from jobsapp.lifecycle.journal.run import worker_of
from jobsapp.lifecycle.rules.scrub import describe_exception, scrub
from jobsapp.lifecycle.transport import unregistered
from jobsapp.lifecycle.transport.envelope import body_fault, header_fault

log = logging.getLogger(__name__)

# Where a RabbitMQ policy sends rejected task messages (``dead-letter-exchange``). The worker
# declares both; the queue keeps the newest messages only, so a flood cannot fill the disk.
DEAD_LETTER_EXCHANGE: Final = Exchange("jobsapp.dead", type="fanout", durable=True)
DEAD_LETTERS: Final = Queue(
    "jobsapp.dead",
    DEAD_LETTER_EXCHANGE,
    durable=True,
    queue_arguments={"x-max-length": 10_000},
)
_LABEL_MAX: Final = 120


def refusal(message: Any) -> str | None:
    """Why ``message`` must not reach Celery, or None; decoding errors are reasons too."""
    fault = header_fault(message.headers)
    if fault is not None:
        return fault
    try:
        payload = message.payload
    except Exception as exc:  # noqa: BLE001 - any decoder failure is a property of the message
        return f"body cannot be decoded: {describe_exception(exc)}"
    return body_fault(payload)


def label(value: Any, missing: str) -> str:
    """A header value fit for one log line: strings as they are (cut), anything else typed."""
    if value is None:
        return missing
    text = value if isinstance(value, str) else f"<{type(value).__name__}>"
    return text[:_LABEL_MAX].encode("unicode_escape").decode("ascii")


class GuardedConsumer(Consumer):
    """Celery's consumer, with every task message checked before its handler runs."""

    # Set by Consumer.__init__; declared here because celery's stubs leave them out.
    connection_errors: tuple[type[BaseException], ...]
    strategies: dict[str, Any]

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Callable[[Any], None]:
        handle = super().create_task_handler(*args, **kwargs)
        # kombu's Redis transport counts KeyError as a connection error; from a message it
        # is the message's fault, and reconnecting would only meet the message again.
        broken_connection = tuple(e for e in self.connection_errors if e is not KeyError)

        def on_task_received(message: Any) -> None:
            reason = refusal(message)
            if reason is None:
                try:
                    return handle(message)  # type: ignore[no-any-return]
                except broken_connection:
                    raise  # the consumer reconnects; the broker redelivers the message
                except Exception as exc:  # noqa: BLE001 - whatever Celery trips on, not fatal
                    reason = f"worker could not accept it: {describe_exception(exc)}"
            self._refuse(message, reason)
            return None

        return on_task_received

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        """A sound message for a task no worker here registered: Celery's answer (its log
        line, the reject, ``FAILURE`` with ``NotRegistered``, ``task-failed`` and
        ``task_unknown``) once the journal keeps the failure; refused as before when the
        journal already answers for it or cannot keep it (``unregistered``)."""
        reason = unregistered.refusal(message, worker_of(self.hostname, os.getpid()))
        if reason is not None:
            self._refuse(message, reason)
            return
        super().on_unknown_task(body, message, exc)

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        """A message kombu could not even build (a ``compression`` header naming no codec):
        refused like the others, where Celery would log CRITICAL and ack it unrecorded."""
        self._refuse(message, f"body cannot be decoded: {describe_exception(exc)}")

    def _refuse(self, message: Any, reason: str) -> None:
        headers = message.headers if isinstance(message.headers, dict) else {}
        log.error(
            "rejected message %s for %s: %s",
            label(headers.get("id"), "<no id>"),
            label(headers.get("task"), "<no task>"),
            scrub(reason),
        )
        if not message.acknowledged:
            message.reject_log_error(log, self.connection_errors, requeue=False)


class DeadLetterQueue(bootsteps.StartStopStep):
    """Declares the dead-letter exchange and queue on AMQP brokers (Redis has no DLX).

    On a channel of its own: a refused declare (no configure permission, a queue of that
    name with other arguments) closes only that channel, and the worker runs on without
    dead letters rather than not at all.
    """

    requires = ("celery.worker.consumer.connection:Connection",)

    def start(self, c: Any) -> None:
        if c.connection.transport.driver_type != "amqp":
            return
        try:
            with c.connection.channel() as channel:
                DEAD_LETTERS.bind(channel).declare()
        except c.connection.channel_errors as exc:
            log.warning("dead-letter queue %s not declared: %s", DEAD_LETTERS.name, exc)
