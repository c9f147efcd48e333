"""Publishing outbox rows: right after COMMIT (fast path) and from the relay in beat.

A row is marked published only after the broker accepted the message: kombu's publish
returns after the RabbitMQ publisher confirm (``confirm_publish``) or Redis's reply to
LPUSH. Losing the mark only causes a republish, which the claim guard absorbs, so the
mark may skip the synchronous commit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from celery import Celery
from sqlalchemy import Connection

from jobsapp import crashpoints
from jobsapp.db import get_relaxed_engine, is_autocommit, utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import PendingMessage
from jobsapp.lifecycle.message import task_id_for, trace_headers, validate_body
from jobsapp.settings import get_settings

log = logging.getLogger(__name__)

# How long a published message may wait for its claim before the relay looks again; it
# doubles with every republish so a busy broker is not flooded with copies.
UNCLAIMED_AFTER = timedelta(minutes=5)
MAX_CHECK_BACKOFF = 6


def next_check(now: datetime, publish_count: int, unclaimed_after: timedelta) -> datetime:
    """When to check that a message published for the ``publish_count+1``-th time landed."""
    factor: int = 2 ** min(publish_count, MAX_CHECK_BACKOFF)
    return now + unclaimed_after * factor


def send(app: Celery, message: PendingMessage, *, now: datetime) -> None:
    """Hand one message to the broker; returns once the broker accepted it."""
    body = {**message.body, "outbox_id": message.id}
    validate_body(body)
    options: dict[str, Any] = {}
    delay = (message.available_at - now).total_seconds()
    if delay > 0:
        options["countdown"] = delay
    app.send_task(
        message.task_name,
        args=(),
        kwargs=body,
        task_id=task_id_for(message.job_id, message.attempt),
        headers=trace_headers(body),
        **options,
    )
    crashpoints.hit("after_publish_before_confirm")


def publish(
    app: Celery,
    messages: Iterable[PendingMessage],
    *,
    unclaimed_after: timedelta = UNCLAIMED_AFTER,
) -> list[tuple[int, datetime]]:
    """Send each message; returns (outbox id, next check) of those the broker accepted."""
    accepted: list[tuple[int, datetime]] = []
    for message in messages:
        now = utcnow()
        try:
            send(app, message, now=now)
        except Exception as exc:  # noqa: BLE001 - the relay republishes whatever failed here
            log.warning("publish of outbox row %s failed: %s", message.id, type(exc).__name__)
            continue
        # A countdown message cannot be claimed before it is due: count from then.
        since = max(now, message.available_at)
        accepted.append((message.id, next_check(since, message.publish_count, unclaimed_after)))
    return accepted


def mark(conn: Connection, accepted: Sequence[tuple[int, datetime]]) -> None:
    if not accepted:
        return
    if conn.dialect.name == "postgresql" and not is_autocommit(conn):
        conn.exec_driver_sql("SET LOCAL synchronous_commit TO off")
    journal.mark_published(conn, accepted, now=utcnow())


def publish_now(app: Celery, messages: Sequence[PendingMessage]) -> int:
    """The fast path after COMMIT; whatever fails here the relay publishes later."""
    unclaimed_after = timedelta(seconds=get_settings().unclaimed_after)
    accepted = publish(app, messages, unclaimed_after=unclaimed_after)
    try:
        with get_relaxed_engine().begin() as conn:
            mark(conn, accepted)
    except Exception as exc:  # noqa: BLE001 - an unmarked row is only republished
        log.warning("marking %d outbox rows published failed: %s", len(accepted), exc)
    return len(accepted)
