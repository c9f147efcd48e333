"""Polling helpers: tests wait for what a user would see, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Engine, text

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


def waiting_for_a_lock(engine: Engine) -> bool:
    """Whether a session of ``engine``'s Postgres database waits on a lock (the moment two
    writers meet, which a test of their interleaving waits for)."""
    with engine.connect() as conn:
        waiting = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        ).scalar_one()
    return bool(waiting)
