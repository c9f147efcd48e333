"""Handing messages to the broker with bounded waits: one try, short timeouts.

Celery's default publish retries a refused connection for about 0.6 s and waits on a
blackholed host as long as the socket lets it, per message. Every message here is
already durable in the outbox, so a publish that fails only delays it: the producer's
fast path and the relay both try once, under ``JOBSAPP_PUBLISH_TIMEOUT`` seconds for the
connect, each socket read and write and the RabbitMQ publisher confirm (default 2 s).

After a broker error the producer's fast path stays off for ``COOLDOWN`` (the relay
publishes meanwhile), so a web request that enqueues many jobs pays the wait once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from amqp.exceptions import MessageNacked
from celery import Celery
from kombu import pools
from kombu.exceptions import BatchPublishError  # type: ignore[attr-defined]  # kombu 5.7
from kombu.exceptions import OperationalError as KombuOperationalError
from kombu.transport.virtual import Transport as VirtualTransport

from jobsapp.settings import get_settings

COOLDOWN = 5.0
# What a broker that is down, refusing or silent raises (a batch's end: kombu's
# BatchPublishError, RabbitMQ's nack); anything else is the message's own fault (a body
# that does not serialise or validate).
BROKER_ERRORS: tuple[type[BaseException], ...] = (
    KombuOperationalError,
    ConnectionError,
    TimeoutError,
    OSError,
    BatchPublishError,
    MessageNacked,
)

_lock = threading.Lock()
_down_until = 0.0


def _bounded_options(app: Celery, seconds: float) -> dict[str, Any]:
    return {
        **(app.conf.broker_transport_options or {}),
        # One connection attempt (kombu retries a refused connect by default).
        "max_retries": 0,
        # Redis transport: connect and every command; pyamqp: handshake, reads, writes.
        "socket_connect_timeout": seconds,
        "socket_timeout": seconds,
        "read_timeout": seconds,
        "write_timeout": seconds,
    }


def bounded_connection(app: Celery, seconds: float | None = None) -> Any:
    """A connection to ``app``'s broker whose every wait (connect, each read and write)
    gives up within ``seconds`` (default: the publish timeout)."""
    if seconds is None:
        seconds = get_settings().publish_timeout
    return app.connection_for_write(
        app.conf.broker_write_url,
        connect_timeout=seconds,
        transport_options=_bounded_options(app, seconds),
    )


@lru_cache(maxsize=32)
def _pool(_pid: int, app: Celery, seconds: float, *_urls_set: Any) -> Any:
    """The pool of bounded producers for ``app``'s broker in process ``_pid`` (a forked
    child gets its own), read from its settings once per ``_urls_set``: the broker URLs
    set on the app (``conf.changes``), where a changed or monkeypatched URL lands."""
    return pools.producers[bounded_connection(app, seconds)]


def _write_pool(app: Celery) -> Any:
    """``_pool`` without reading Celery's settings on every publish: a settings lookup
    costs about 12 us, ``broker_write_url`` three of them and two environment reads."""
    changes = app.conf.changes or {}
    urls_set = (changes.get("broker_write_url"), changes.get("broker_url"))
    return _pool(os.getpid(), app, get_settings().publish_timeout, *urls_set)


@contextmanager
def producer(app: Celery) -> Iterator[Any]:
    """A pooled producer whose connection gives up within the publish timeout.

    Pass it to ``send_task(..., producer=p, retry=False)``. kombu keys its producer pools
    by the connection's parameters and drops them in a forked child.
    """
    pool = _write_pool(app)
    with pool.acquire(block=True) as pooled:
        try:
            yield pooled
        except BROKER_ERRORS:
            # A half-open connection must not be handed to the next publish.
            pooled.connection.collect()
            raise


@contextmanager
def batch(producer: Any, max_size: int) -> Iterator[None]:
    """kombu's publish batch on ``producer``: the publishes inside reach the broker together
    at the block's end, in one round trip (Redis: a pipeline; RabbitMQ: one wait for the
    confirms, ``amqp_transport``). The end raises a broker's errors as kombu's, as
    ``send_task`` does for a publish of its own."""
    with producer.connection._reraise_as_library_errors(), producer.batch(max_size=max_size):
        yield


@dataclass(frozen=True)
class Declared:
    """A queue as a passive declare answers: its ready messages (Redis adds up the queue's
    priority lists) and, on RabbitMQ, its consumers (kombu's virtual transports count none)."""

    messages: int
    consumers: int | None


def declared(app: Celery, queues: Iterable[str]) -> dict[str, Declared | None]:
    """Each queue as the broker sees it, None for a queue RabbitMQ does not know (on Redis
    an empty queue is no key at all: zero messages). On a pooled connection bounded like a
    publish, nothing created; raises ``BROKER_ERRORS``."""
    with producer(app) as pooled:
        connection = pooled.connection
        return {name: _declared(connection, name) for name in dict.fromkeys(queues)}


def queue_depths(app: Celery, queues: Iterable[str]) -> dict[str, int]:
    """Messages ready in each queue; a queue the broker does not know holds none."""
    return {name: 0 if d is None else d.messages for name, d in declared(app, queues).items()}


def _declared(connection: Any, queue: str) -> Declared | None:
    virtual = isinstance(connection.transport, VirtualTransport)
    # RabbitMQ closes the channel that asked for an unknown queue: a channel of its own
    # there. A virtual transport's answers on the connection's own (a channel of kombu's
    # Redis transport builds a client: a millisecond each).
    channel = connection.default_channel if virtual else connection.channel()
    try:
        _, messages, consumers = channel.queue_declare(queue=queue, passive=True)
    except connection.channel_errors:
        return Declared(0, None) if virtual else None
    finally:
        if not virtual:
            channel.close()
    return Declared(int(messages), None if virtual else int(consumers))


def fast_path_open() -> bool:
    """False while the broker failed a publish less than ``COOLDOWN`` seconds ago."""
    return time.monotonic() >= _down_until


def broker_failed() -> None:
    global _down_until  # noqa: PLW0603 - one process-wide breaker, see the module doc
    with _lock:
        _down_until = time.monotonic() + COOLDOWN


def broker_answered() -> None:
    global _down_until  # noqa: PLW0603
    with _lock:
        _down_until = 0.0
