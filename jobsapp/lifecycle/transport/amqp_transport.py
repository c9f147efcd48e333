"""kombu's py-amqp transport, with a publish batch that waits for its confirms once.

With ``confirm_publish`` (celeryconfig.py) py-amqp waits for RabbitMQ's publisher confirm
after every message: a batch of n messages costs n round trips. kombu's
``Producer.batch()`` lets a transport defer its publishes (kombu's Redis transport
pipelines them); here a batch writes each message at once and ``flush`` waits until the
broker confirmed every one of them, so the batch costs one round trip. A message the broker
refuses (a nack) fails the whole flush: the caller cannot tell which one it was, and
publishing them all again is safe (the claim deduplicates). The batch's frames leave in
a few socket writes rather than one per message: the same bytes, in the same order.
``jobsapp.celery_app`` selects this transport for ``amqp://`` and ``pyamqp://`` broker URLs,
and ``SSLTransport`` for ``amqps://``.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from amqp import spec
from amqp.exceptions import MessageNacked
from amqp.method_framing import frame_writer
from kombu.transport import pyamqp

_CONFIRMS = [spec.Basic.Ack, spec.Basic.Nack]
# Bytes of held frames written at once (a batch of 1,000 small messages: a few writes).
_HELD_MAX = 256 * 1024


class HeldWrites:
    """A connection's socket writes, held while a batch publishes (a ``sendall`` per message
    was a fifth of a batch's time). Any other frame, such as a declare that waits for its
    answer, first writes what is held, so frames leave in the order they were made."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._held = bytearray()
        self.holding = False

    def write(self, data: Any) -> None:
        if self.holding:
            # A copy: py-amqp hands over a view of the buffer it reuses for the next frame.
            self._held += data
            if len(self._held) >= _HELD_MAX:
                self.flush()
            return
        self.flush()
        self._transport.write(data)

    def flush(self) -> None:
        if self._held:
            held, self._held = self._held, bytearray()
            self._transport.write(held)


def _held_frame_writer(connection: Any, transport: Any) -> Any:
    """py-amqp's frame writer, writing through the connection's ``HeldWrites``."""
    connection.held_writes = HeldWrites(transport)
    return frame_writer(connection, connection.held_writes)


class Channel(pyamqp.Channel):
    # RabbitMQ numbers the messages of a channel in confirm mode 1, 2, ...: the delivery
    # tag of the channel's last publish, which its confirm names.
    _last_tag = 0

    def confirm_select(self, nowait: bool = False) -> Any:
        self._last_tag = 0
        return super().confirm_select(nowait)

    def _basic_publish(self, *args: Any, **kwargs: Any) -> Any:
        if self._confirm_selected:  # type: ignore[attr-defined]
            self._last_tag += 1
        return super()._basic_publish(*args, **kwargs)  # type: ignore[misc]

    def create_publish_batch(self, max_size: int) -> PublishBatch:  # noqa: ARG002 - see PublishBatch
        return PublishBatch(self)


class PublishBatch:
    """The session kombu's ``Producer.batch()`` publishes through (``max_size`` does not
    apply: nothing is buffered here, the confirms are what waits).

    Confirms come in any order (messages of different queues are confirmed as each queue
    takes them), one tag at a time or ``multiple`` (every tag up to it): the batch waits
    until each of its own tags was confirmed.
    """

    def __init__(self, channel: Any) -> None:
        # A ``Channel``; py-amqp's attributes (events, _confirm_selected) are missing
        # from its stubs.
        self.channel = channel
        self._timeout: float | None = None
        self._unconfirmed: set[int] = set()
        self._nacked: int | None = None
        # Listening from the start: a confirm may be read while a declare waits.
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)

    def _on_ack(self, tag: int, multiple: bool) -> None:
        if multiple:
            self._unconfirmed = {t for t in self._unconfirmed if t > tag}
        else:
            self._unconfirmed.discard(tag)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        if tag in self._unconfirmed or (multiple and any(t <= tag for t in self._unconfirmed)):
            self._nacked = tag
        self._on_ack(tag, multiple)

    def publish(self, message: Any, **kwargs: Any) -> Any:
        channel = self.channel
        timeout = kwargs.pop("confirm_timeout", None) or kwargs.get("timeout")
        self._timeout = timeout or self._timeout
        if channel.connection.confirm_publish and not channel._confirm_selected:
            channel._confirm_selected = True
            channel.confirm_select()
        held = channel.connection.held_writes
        held.holding = True
        try:
            published = channel._basic_publish(message, **kwargs)
        finally:
            held.holding = False
        if channel._confirm_selected:
            self._unconfirmed.add(channel._last_tag)
        return published

    def flush(self) -> None:
        """Returns once the broker confirmed every message of the batch; raises if it
        refused one."""
        self.channel.connection.held_writes.flush()
        while self._unconfirmed:
            self.channel.wait(_CONFIRMS, timeout=self._timeout)
        if self._nacked is not None:
            raise MessageNacked(f"RabbitMQ refused message {self._nacked} of a batch")

    def discard(self) -> None:
        """What was published goes to the broker even so: RabbitMQ must number as many
        messages as the channel counted. A connection that fails here is being dropped."""
        connection = self.channel.connection
        with suppress(*connection.connection_errors):
            connection.held_writes.flush()

    def close(self) -> None:
        self.channel.events["basic_ack"].discard(self._on_ack)
        self.channel.events["basic_nack"].discard(self._on_nack)


class Connection(pyamqp.Connection):
    Channel = Channel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("frame_writer", _held_frame_writer)
        super().__init__(*args, **kwargs)


class Transport(pyamqp.Transport):
    """py-amqp, with publish batches that wait for their confirms once."""

    Connection = Connection
    implements = pyamqp.Transport.implements.extend(batch_publish=True)


class SSLTransport(Transport, pyamqp.SSLTransport):
    """The same over TLS (``amqps://``): kombu's rule for the connection's TLS, Celery's
    ``broker_use_ssl`` when the deployment sets it, else the default context."""
