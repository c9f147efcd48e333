"""kombu's py-amqp transport, with a publish batch that waits for its confirms once.

With ``confirm_publish`` (celeryconfig.py) py-amqp waits for RabbitMQ's publisher confirm
after every message: a batch of n messages costs n round trips. kombu's
``Producer.batch()`` lets a transport defer its publishes (kombu's Redis transport
pipelines them); here a batch writes each message at once and ``flush`` waits until the
broker confirmed the last one, so the batch costs one round trip. A message the broker
refuses (a nack) fails the whole flush: the caller cannot tell which one it was, and
publishing them all again is safe (the claim deduplicates). ``jobsapp.celery_app``
selects this transport for ``amqp://`` and ``pyamqp://`` broker URLs.
"""

from __future__ import annotations

from typing import Any

from amqp import spec
from amqp.exceptions import MessageNacked
from kombu.transport import pyamqp

_CONFIRMS = [spec.Basic.Ack, spec.Basic.Nack]


class Channel(pyamqp.Channel):
    # RabbitMQ numbers the messages of a channel in confirm mode 1, 2, ...: the delivery
    # tag of the channel's last publish, which a confirm names (with ``multiple``, every
    # tag up to it).
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
    apply: nothing is buffered here, the confirms are what waits)."""

    def __init__(self, channel: Any) -> None:
        # A ``Channel``; py-amqp's attributes (events, _confirm_selected) are missing
        # from its stubs.
        self.channel = channel
        self._timeout: float | None = None
        # Every earlier publish on the channel was confirmed (or its wait gave up).
        self._confirmed = channel._last_tag
        self._nacked: int | None = None
        # Listening from the start: a confirm may be read while a declare waits.
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)

    def _on_ack(self, tag: int, _multiple: bool) -> None:
        self._confirmed = max(self._confirmed, tag)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self._on_ack(tag, multiple)
        self._nacked = tag

    def publish(self, message: Any, **kwargs: Any) -> Any:
        channel = self.channel
        timeout = kwargs.pop("confirm_timeout", None) or kwargs.get("timeout")
        self._timeout = timeout or self._timeout
        if channel.connection.confirm_publish and not channel._confirm_selected:
            channel._confirm_selected = True
            channel.confirm_select()
        return channel._basic_publish(message, **kwargs)

    def flush(self) -> None:
        """Returns once the broker confirmed every message published on the channel."""
        channel = self.channel
        while channel._confirm_selected and self._confirmed < channel._last_tag:
            channel.wait(_CONFIRMS, timeout=self._timeout)
        if self._nacked is not None:
            raise MessageNacked(f"RabbitMQ refused message {self._nacked} of a batch")

    def discard(self) -> None:
        """Nothing is buffered: what was published is with the broker."""

    def close(self) -> None:
        self.channel.events["basic_ack"].discard(self._on_ack)
        self.channel.events["basic_nack"].discard(self._on_nack)


class Connection(pyamqp.Connection):
    Channel = Channel


class Transport(pyamqp.Transport):
    """py-amqp, with publish batches that wait for their confirms once."""

    Connection = Connection
    implements = pyamqp.Transport.implements.extend(batch_publish=True)
