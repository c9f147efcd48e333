"""A publish batch's later messages of one shape as copies of the first, which Celery built.

Of two messages for the same task with the same options, what Celery's ``as_task_v2`` and
``send_task_message`` hand kombu and the event dispatcher differs only in the call's own
values: the task id (header ``id``, property ``correlation_id``, the event's ``uuid``), its
lineage (``root_id``, ``parent_id``), its reprs, ``retries``, the caller's headers and the
body's arguments. So the first message of each shape in a batch goes through Celery whole,
what it handed on is kept, and the later ones are copies with their own values put in,
published through the same ``Producer.publish`` (kombu frames and sends every message):
routing, the message's construction and the publish's options are worked out once per
shape instead of once per message.

A first message that carries one of its call's values anywhere else (a Celery that adds a
per-call field) keeps its shape from being copied: each of its messages then goes through
Celery, as before. tests/integration/test_batch_publish.py holds a batch's messages and
events equal to what ``send_task`` sends for each job alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Producer.publish's keyword arguments that are a call's own besides its headers.
_OWN_PROPERTIES = ("correlation_id", "argsrepr", "kwargsrepr")


@dataclass(frozen=True)
class Call:
    """One message's own values: what ``send_task`` is given per call."""

    task_id: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    retries: int
    root_id: str | None
    parent_id: str | None
    argsrepr: str
    kwargsrepr: str
    headers: Mapping[str, Any]

    def header_values(self) -> dict[str, Any]:
        # as_task_v2 roots a call without a root at itself.
        return {
            "id": self.task_id,
            "root_id": self.root_id or self.task_id,
            "parent_id": self.parent_id,
            "argsrepr": self.argsrepr,
            "kwargsrepr": self.kwargsrepr,
            "retries": self.retries,
            **self.headers,
        }

    def property_values(self) -> dict[str, Any]:
        return {
            "correlation_id": self.task_id,
            "argsrepr": self.argsrepr,
            "kwargsrepr": self.kwargsrepr,
        }

    def event_values(self) -> dict[str, Any]:
        return {
            "uuid": self.task_id,
            "root_id": self.root_id or self.task_id,
            "parent_id": self.parent_id,
            "args": self.argsrepr,
            "kwargs": self.kwargsrepr,
            "retries": self.retries,
        }

    def own_strings(self) -> frozenset[str]:
        """The call's own text values: found in a field a copy keeps, they rule copies out."""
        values = (self.task_id, self.root_id, self.parent_id, self.argsrepr, self.kwargsrepr)
        return frozenset(v for v in values if v)


@dataclass(frozen=True)
class Template:
    """What Celery handed on for the first message of a shape."""

    embed: Any  # the body's third part: callbacks, errbacks, chain, chord
    publish: dict[str, Any]  # Producer.publish's keyword arguments
    properties: tuple[str, ...]  # which of _OWN_PROPERTIES they hold
    event: dict[str, Any] | None  # the task-sent event's fields

    @classmethod
    def of(
        cls, call: Call, body: Any, publish: dict[str, Any], event: dict[str, Any] | None
    ) -> Template | None:
        """The template of what Celery sent for ``call``; None if a copy could differ
        from what Celery would send."""
        if not (isinstance(body, tuple) and len(body) == 3):
            return None  # not message protocol 2
        if body[0] != call.args or body[1] != call.kwargs:
            return None
        headers = publish.get("headers")
        if not isinstance(headers, dict):
            return None
        properties = tuple(k for k in _OWN_PROPERTIES if k in publish)
        own = call.property_values()
        kept = {k: v for k, v in publish.items() if k != "headers" and k not in properties}
        strings = call.own_strings()
        if not (
            _holds(headers, call.header_values(), strings)
            and all(publish[k] == own[k] for k in properties)
            and "correlation_id" in properties
            and _holds(kept, {}, strings)
            and (event is None or _holds(event, call.event_values(), strings))
        ):
            return None
        return cls(body[2], publish, properties, event)

    def message(self, call: Call) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The body and ``Producer.publish``'s keyword arguments of ``call``'s message."""
        publish = dict(self.publish)
        headers = dict(publish["headers"])
        headers.update(call.header_values())
        publish["headers"] = headers
        own = call.property_values()
        for name in self.properties:
            publish[name] = own[name]
        declare = publish.get("declare")
        if declare is not None:
            # kombu may add the producer's exchange to the list it is given.
            publish["declare"] = list(declare)
        return (call.args, call.kwargs, self.embed), publish

    def sent_event(self, call: Call) -> dict[str, Any] | None:
        if self.event is None:
            return None
        event = dict(self.event)
        event.update(call.event_values())
        return event


def _holds(fields: Mapping[str, Any], own: Mapping[str, Any], strings: frozenset[str]) -> bool:
    """Whether ``fields`` hold the call's values under ``own``'s names and none elsewhere."""
    if any(fields.get(k, _MISSING) != v for k, v in own.items()):
        return False
    return not any(isinstance(v, str) and v in strings for k, v in fields.items() if k not in own)


_MISSING = object()
