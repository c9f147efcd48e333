"""Which Redis list items kombu can turn into a message."""

from __future__ import annotations

from typing import Any

import pytest

from jobsapp.lifecycle.transport.redis_transport import frame_fault

PROPERTIES = {
    "delivery_tag": "t",
    "body_encoding": "base64",
    "delivery_info": {"exchange": "celery", "routing_key": "celery"},
}


def frame(body: Any = "W10=", **properties: Any) -> dict[str, Any]:
    return {"body": body, "headers": {}, "properties": {**PROPERTIES, **properties}}


@pytest.mark.parametrize("good", [frame(), frame(None), frame(body_encoding=None)])
def test_what_kombu_publishes_is_readable(good: dict[str, Any]) -> None:
    assert frame_fault(good) is None


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ([], "the Redis item is a list, not a kombu message"),
        ({}, "the Redis item has no properties"),
        (frame(delivery_tag=None), "the Redis item has no delivery tag"),
        (
            frame(delivery_info={"exchange": "celery"}),
            "the Redis item has no exchange and routing key",
        ),
        (frame(body_encoding="rot13"), "the Redis item's body encoding 'rot13' is unknown"),
        (frame({"a": 1}), "the Redis item's body is a dict, not text"),
    ],
)
def test_an_item_kombu_would_trip_on_is_named(bad: Any, reason: str) -> None:
    assert frame_fault(bad) == reason
