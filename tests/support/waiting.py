"""Polling helpers: tests wait for what a user would see, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(probe: Callable[[], T], *, timeout: float = 20.0, interval: float = 0.1) -> T:
    """Return the first truthy value of ``probe()``; fail with the last one at the deadline."""
    deadline = time.monotonic() + timeout
    value = probe()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        time.sleep(interval)
        value = probe()
    return value
