"""Guessing made expensive: failed token checks (the login form, a bearer token) slow down
their client address, and everyone's failures together slow down every address that failed.

The counts are rows of ``web_throttle`` (migration 0024), so every gunicorn worker process
sees the same ones. ``FREE_FAILURES`` failures of an address within ``WINDOW`` cost nothing;
each next one makes it wait twice as long as the one before (2 s, 4 s, ... at most
``ADDRESS_MAX_WAIT``), answered 429 with ``Retry-After`` whatever it sends meanwhile, the
right token included. A success forgets the address's failures. Past ``GLOBAL_FREE``
failures of everyone within the window (a guesser with many addresses) every address that
has failed waits too, at most ``GLOBAL_MAX_WAIT``; an address that has not failed (the real
operator's, typically) is never held by the others' guesses.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import Connection, Table, case, delete, select, update
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from jobsapp.db import console_engine, utcnow
from jobsapp.lifecycle.journal import upsert
from jobsapp.web.session_tables import WebThrottle

log = logging.getLogger(__name__)

FREE_FAILURES = 5
ADDRESS_MAX_WAIT = timedelta(minutes=5)
GLOBAL_FREE = 100
GLOBAL_MAX_WAIT = timedelta(seconds=30)
WINDOW = timedelta(minutes=15)
EVERYONE = "*"
_THROTTLE: Table = WebThrottle.__table__  # type: ignore[assignment]
_DB_DOWN = (OperationalError, InterfaceError, PoolTimeout)


class Throttled(Exception):
    """Too many failed guesses: try again in ``retry_after`` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"Too many failed attempts; retry in {retry_after} s.")
        self.retry_after = retry_after


def wait_after(failures: int, free: int, most: timedelta) -> timedelta:
    """How long a scope waits after its ``failures``-th failure: nothing for the first
    ``free``, then 2 s doubled at each next one, at most ``most``."""
    if failures <= free:
        return timedelta(0)
    return min(timedelta(seconds=2 ** min(failures - free, 30)), most)


def checked(address: str, what: str, check: Callable[[], bool]) -> bool:
    """``check()`` of a credential from ``address``, unless the address must wait (raises
    Throttled); a failure is counted and logged once with the address, never the token."""
    engine, now = console_engine(), utcnow()
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(_THROTTLE).where(_THROTTLE.c.scope.in_((address, EVERYONE)))
            ).mappings()
            found = {row["scope"]: row for row in rows}
    except _DB_DOWN:
        # Only the process's own /metrics answers without the database: unthrottled then.
        log.warning("%s checked unthrottled: the database is unreachable", what)
        return check()
    mine = found.get(address)
    everyone = found.get(EVERYONE)
    until = [mine["blocked_until"]] if mine else []
    if mine and everyone:  # the others' guesses hold only an address that failed too
        until.append(everyone["blocked_until"])
    left = max(until, default=now) - now
    if left > timedelta(0):
        retry = math.ceil(left.total_seconds())
        log.warning("%s refused: %s must wait %d s after failed attempts", what, address, retry)
        raise Throttled(retry)
    if check():
        if mine:
            with engine.begin() as conn:
                conn.execute(delete(_THROTTLE).where(_THROTTLE.c.scope == address))
        return True
    with engine.begin() as conn:
        failures = _failed(conn, address, now, FREE_FAILURES, ADDRESS_MAX_WAIT)
        _failed(conn, EVERYONE, now, GLOBAL_FREE, GLOBAL_MAX_WAIT)
    log.warning("%s refused: wrong token from %s (failure %d)", what, address, failures)
    return False


def _failed(conn: Connection, scope: str, now: datetime, free: int, most: timedelta) -> int:
    """Count a failure of ``scope`` (the window starts again after a quiet one)."""
    fresh = _THROTTLE.c.last_at < now - WINDOW
    counted = (
        upsert(conn, _THROTTLE)
        .values(scope=scope, failures=1, last_at=now, blocked_until=now)
        .on_conflict_do_update(
            index_elements=[_THROTTLE.c.scope],
            set_={"failures": case((fresh, 1), else_=_THROTTLE.c.failures + 1), "last_at": now},
        )
        .returning(_THROTTLE.c.failures)
    )
    failures = int(conn.execute(counted).scalar_one())
    wait = wait_after(failures, free, most)
    if wait:
        conn.execute(
            update(_THROTTLE).where(_THROTTLE.c.scope == scope).values(blocked_until=now + wait)
        )
    return failures
