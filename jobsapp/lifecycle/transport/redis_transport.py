"""kombu's Redis transport, refusing list items that are not kombu messages.

On Redis a message is a JSON frame (body, headers, properties) pushed on a list. kombu
parses the frame inside the worker's event loop, before any consumer code runs: an item
that is not JSON, or a frame without its properties, raised there and stopped the worker
("Unrecoverable error: JSONDecodeError"). The item is already popped from the list when
that happens, so refusing it is only a matter of logging it and carrying on, in the form
of ``jobsapp.lifecycle.transport.guard``.

Priorities are kombu's, untouched: one list per priority step, read smallest first, so
``priority=0`` (and a message without one) is the most urgent, as for any Celery app on
Redis (docs/flow-control.md, "Priorities"). ``jobsapp.celery_app`` selects ``Transport``
for ``redis://`` and ``rediss://`` broker URLs, ``SocketTransport`` for
``redis+socket://``, and ``SentinelTransport`` (kombu's, which asks Redis Sentinel for the
master, again after a failover) for ``sentinel://``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

from kombu.transport import redis

log = logging.getLogger(__name__)

_REFUSED: Final = "rejected message <unreadable> for <no task>: %s"
_BODY_ENCODINGS: Final = (None, "base64", "utf-8")
_ROUTE: Final = ("exchange", "routing_key")


def frame_fault(frame: Any) -> str | None:
    """Why kombu cannot turn this parsed list item into a message, or None."""
    if not isinstance(frame, Mapping):
        return f"the Redis item is {_kind(frame)}, not a kombu message"
    properties = frame.get("properties")
    if not isinstance(properties, Mapping):
        return "the Redis item has no properties"
    fault = _properties_fault(properties)
    if fault is None and not isinstance(frame.get("body"), str | None):
        fault = f"the Redis item's body is {_kind(frame['body'])}, not text"
    return fault


def _properties_fault(properties: Mapping[str, Any]) -> str | None:
    if not isinstance(properties.get("delivery_tag"), str):
        return "the Redis item has no delivery tag"
    info = properties.get("delivery_info")
    if not (isinstance(info, Mapping) and all(isinstance(info.get(k), str) for k in _ROUTE)):
        return "the Redis item has no exchange and routing key"
    if properties.get("body_encoding") not in _BODY_ENCODINGS:
        return f"the Redis item's body encoding {properties['body_encoding']!r} is unknown"
    return None


def _kind(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


class Channel(redis.Channel):
    _shared: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """One client for the channel's synchronous commands (publish, ack, restore).

        kombu builds a ``redis.Redis`` for each of them, and redis-py's constructor costs
        about a quarter of a millisecond; the client holds no connection of its own (it
        borrows one from the pool per command, thread-safely), so one can serve them all.
        It is rebuilt whenever kombu replaces the pool (after a fork or a reconnect), so
        connection handling stays kombu's and redis-py's.
        """
        if client:
            yield client
            return
        pool = self.pool
        if self._shared is None or self._shared.connection_pool is not pool:
            self._shared = self._create_client()  # type: ignore[attr-defined]
        yield self._shared

    def _brpop_read(self, **options: Any) -> bool:
        try:
            return bool(super()._brpop_read(**options))  # type: ignore[misc]
        except ValueError as exc:  # not JSON, not UTF-8, not base64: the item is gone
            log.error(_REFUSED, f"the Redis item cannot be parsed: {type(exc).__name__}")
            return True


class _Guarded:
    """Every popped item checked before kombu builds a message of it."""

    def _deliver(self, message: Any, queue: str | None) -> None:
        fault = frame_fault(message)
        if fault is not None:
            log.error(_REFUSED, fault)
            return
        super()._deliver(message, queue)  # type: ignore[misc]


class Transport(_Guarded, redis.Transport):
    """Redis, with every popped item checked before kombu builds a message of it."""

    Channel = Channel


class SocketTransport(Transport):
    """Redis on a Unix socket. kombu reads ``redis+socket:///path`` as its own ``redis``
    transport, whatever the app's ``broker_transport`` says (the URL's prefix names the
    transport), so ``jobsapp.celery_app`` hands Celery the same socket as ``socket:///path``
    with this transport. kombu's channel connects by such a host itself; the URL stays
    whole (``can_parse_url``) for it to read, its ``?virtual_host=N`` included."""

    can_parse_url = True


class SentinelChannel(Channel, redis.SentinelChannel):
    """kombu's Sentinel channel (its pool follows the master) with this module's client
    and parse guard."""


class SentinelTransport(_Guarded, redis.SentinelTransport):
    """Redis behind Sentinel: ``sentinel://host:26379;sentinel://host2:26379`` and the
    ``master_name`` transport option, as kombu takes them."""

    Channel = SentinelChannel
