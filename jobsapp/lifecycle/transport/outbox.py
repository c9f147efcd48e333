"""Publishing outbox rows: right after COMMIT (fast path) and from the relay in beat.

A row is marked published only after the broker accepted the message: kombu's publish
returns after the RabbitMQ publisher confirm (``confirm_publish``) or Redis's reply to
LPUSH. Each message is tried once with bounded waits (``publisher``); a run stops at the
first broker error, and a message that fails on its own is reported so the relay can
back the row off. Losing the mark only causes a republish, which the claim guard absorbs, so the
mark may skip the synchronous commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery import Celery
from sqlalchemy import Connection, Engine

from jobsapp import crashpoints
from jobsapp.db import get_relaxed_engine, is_autocommit, utcnow
from jobsapp.lifecycle.flow.priorities import serving_rank
from jobsapp.lifecycle.journal import PendingMessage, on_local_clock, outbox_queries
from jobsapp.lifecycle.rules.message import (
    BuiltBody,
    task_id_for,
    time_limits,
    trace_headers,
    validate_body,
)
from jobsapp.lifecycle.transport import batch_send, hooks, marker, publisher, tracing
from jobsapp.settings import get_settings

log = logging.getLogger(__name__)

# How long a published message may wait for its claim before the relay looks again; it
# doubles with every republish so a busy broker is not flooded with copies.
UNCLAIMED_AFTER = timedelta(minutes=5)
MAX_CHECK_BACKOFF = 6
MAX_ERROR = 500
# Row ids a refusal's log line names (a batch of 1,000 refused alike is one line).
REFUSED_SHOWN = 20
# A row whose message fails on its own is tried again after a doubling pause, and after
# this many failures it is dead (listed for an operator) instead of tried every tick.
REFUSAL_BACKOFF = timedelta(seconds=10)
MAX_REFUSAL_BACKOFF = timedelta(minutes=10)
MAX_PUBLISH_FAILURES = 8
# A message published this often and never claimed is for a task no worker takes: dead.
MAX_UNCLAIMED_PUBLISHES = 10
# Celery's own bound on a task's kwargs text (``AMQP.kwargsrepr_maxsize``).
KWARGSREPR_MAX = 1024
# Messages per broker round trip: a batch of 1,000 goes in one; a larger one is cut so the
# pipeline buffered in memory stays a few MB.
PIPELINE_MAX = 1000


def retry_after_refusal(failures: int) -> timedelta | None:
    """The pause after a row's ``failures``-th refused publish; None: the row is dead."""
    if failures >= MAX_PUBLISH_FAILURES:
        return None
    pause: timedelta = REFUSAL_BACKOFF * 2 ** (failures - 1)
    return min(pause, MAX_REFUSAL_BACKOFF)


def setbacks(
    messages: Sequence[PendingMessage], refused: Sequence[tuple[int, str]], now: datetime
) -> list[outbox_queries.Setback]:
    """What each refused publish does to its row (pure: the relay writes the result)."""
    by_id = {m.id: m for m in messages}
    out = []
    for outbox_id, error in refused:
        message = by_id[outbox_id]
        pause = retry_after_refusal(message.publish_failures + 1)
        out.append(outbox_queries.Setback(message, error, None if pause is None else now + pause))
    return out


def lost_and_waiting(
    unclaimed: Sequence[PendingMessage],
    depths: Mapping[str, int],
    queue_of: Callable[[PendingMessage], str],
    *,
    lowest_first: bool,
) -> tuple[list[PendingMessage], list[PendingMessage]]:
    """Split unclaimed messages (oldest first) into those the broker lost and those that
    may still wait in their queue.

    A queue serves its most urgent messages first (``lowest_first``: the broker's meaning
    of ``priority``, ``lifecycle.priorities``) and, within a priority, the oldest: if
    it holds n messages, they may be the n its consumers would take last, and only the
    others are certainly gone. Nothing in a queue names its job, so a message that may
    still be waiting is never taken for lost: a slow queue gets no copies (nor a low
    priority one starved by urgent traffic), and a lost message behind a backlog is
    republished once the backlog has shrunk below it.
    """
    by_queue: dict[str, list[PendingMessage]] = {}
    # In the order the queue serves them (a stable sort keeps the oldest first).
    for message in sorted(
        unclaimed, key=lambda m: serving_rank(m.priority, lowest_first=lowest_first)
    ):
        by_queue.setdefault(queue_of(message), []).append(message)
    lost: list[PendingMessage] = []
    waiting: list[PendingMessage] = []
    for queue, messages in by_queue.items():
        gone = max(0, len(messages) - depths.get(queue, 0))
        lost.extend(messages[:gone])
        waiting.extend(messages[gone:])
    return lost, waiting


def never_claimed(message: PendingMessage) -> bool:
    """Published ``MAX_UNCLAIMED_PUBLISHES`` times and its attempt still not claimed."""
    return message.publish_count >= MAX_UNCLAIMED_PUBLISHES


def check_wait(publish_count: int, unclaimed_after: timedelta) -> timedelta:
    """How long after it can be claimed to check that a message published for the
    ``publish_count+1``-th time landed."""
    factor: int = 2 ** min(publish_count, MAX_CHECK_BACKOFF)
    return unclaimed_after * factor


def _attempt_links(message: PendingMessage) -> dict[str, Any]:
    """What Flower shows of an attempt: a job_id/attempt label in its args column, the
    earlier attempts as Celery retries, the previous attempt's task as its parent, a
    first attempt's sender when its run keeps one (``PendingMessage.lineage``), and the
    call's display name (``shadow``), which names it in logs and events as in Celery."""
    links: dict[str, Any] = {
        "argsrepr": f"job_id={message.job_id} attempt={message.attempt}",
        "retries": message.attempt - 1,
    }
    if message.shadow is not None:
        links["shadow"] = message.shadow
    if message.attempt > 1:
        links["parent_id"] = task_id_for(message.job_id, message.attempt - 1)
        links["root_id"] = task_id_for(message.job_id, 1)
    elif message.lineage is not None:
        # The sender's, or the call's own, as send_task stamps them: a publisher outside
        # the calling task (the relay), or a caller outside any task, has none to stamp.
        root, parent = message.lineage
        if root is not None:
            links["root_id"] = root
        if parent is not None:
            links["parent_id"] = parent
    return links


def send(
    app: Celery,
    message: PendingMessage,
    *,
    now: datetime,
    producer: Any,
    sender: batch_send.BatchSender | None = None,
) -> None:
    """Hand one message to the broker, once; inside ``publisher.batch`` it is sent and
    accepted at the batch's end, else before this returns. A batch's ``sender`` sends
    what ``send_task`` would."""
    body = {**message.body, "outbox_id": message.id}
    if not isinstance(message.body, BuiltBody):  # checked when built; outbox ids are >= 1
        validate_body(body)
    options = _routing(message)
    delay = (message.available_at - now).total_seconds()
    if delay > 0:
        options["countdown"] = delay
    send_task = app.send_task if sender is None else sender.send_task
    # The stored trace context matters only to what watches the publish (see ``tracing``).
    watched = batch_send.publish_watched() if sender is None else sender.watched
    with tracing.publishing(body) if watched else nullcontext():
        send_task(
            message.task_name,
            args=(),
            kwargs=body,
            task_id=task_id_for(message.job_id, message.attempt),
            **_attempt_links(message),
            kwargsrepr=_kwargsrepr(body),
            headers=trace_headers(body),
            producer=producer,
            retry=False,
            # A message is an attempt: its call joined its sender's children when it was
            # enqueued (LifecycleTask.apply_async), whoever publishes it.
            add_to_parent=False,
            **options,
        )


def _kwargsrepr(body: dict[str, Any]) -> str | None:
    """Flower's kwargs column: Celery's saferepr walks the body in Python, and for a flat
    body of strings and numbers gives the same text as ``repr``; a long one (None) is left
    to Celery, which truncates it."""
    text = repr(body)
    return text if len(text) <= KWARGSREPR_MAX else None


def queue_name(app: Celery, message: PendingMessage) -> str:
    """The queue ``send`` puts the message in."""
    options = {"queue": message.queue} if message.queue is not None else {}
    return str(app.amqp.router.route(options, message.task_name, (), {})["queue"].name)


def _routing(message: PendingMessage) -> dict[str, Any]:
    """The queue the producer chose (else ``task_routes`` and the default queue decide),
    the job's priority (0 is left out: both brokers read a message without one as 0,
    the most urgent on Redis and the least on RabbitMQ, as plain Celery has it), and the
    time limits of its call (the ``timelimit`` header the prefork pool enforces)."""
    options: dict[str, Any] = time_limits(message.body)
    if message.queue is not None:
        options["queue"] = message.queue
    if message.priority:
        options["priority"] = message.priority
    return options


@dataclass
class Report:
    """What one publish run did: accepted rows, rows that refused, a broker that failed."""

    accepted: list[outbox_queries.Accepted] = field(default_factory=list)
    # (outbox id, error) of each row whose message itself failed (it does not validate).
    refused: list[tuple[int, str]] = field(default_factory=list)
    broker_error: str | None = None

    @property
    def handled(self) -> int:
        return len(self.accepted) + len(self.refused)


def publish(
    app: Celery,
    messages: Iterable[PendingMessage],
    *,
    unclaimed_after: timedelta = UNCLAIMED_AFTER,
    by_running_task: bool = True,
) -> Report:
    """Send the messages, up to ``PIPELINE_MAX`` per broker round trip; stop at the first
    broker error (the rest would wait as long). Not ``by_running_task``: the worker's task
    running in this thread did not make these calls, so it is not their sender (Celery's
    send_task would stamp it as their root and parent)."""
    report = Report()
    pending = list(messages)
    if not pending:
        return report
    try:
        with publisher.producer(app) as producer:
            for start in range(0, len(pending), PIPELINE_MAX):
                if start:
                    crashpoints.hit("between_publish_round_trips")
                chunk = pending[start : start + PIPELINE_MAX]
                _publish_chunk(app, chunk, producer, unclaimed_after, report, by_running_task)
    except publisher.BROKER_ERRORS as exc:
        report.broker_error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR]
        log.warning(
            "broker refused a publish (%s); %d of %d messages left for the relay",
            type(exc).__name__,
            len(pending) - report.handled,
            len(pending),
        )
    if report.refused:
        _log_refused(report.refused)
    return report


def _publish_chunk(
    app: Celery,
    chunk: Sequence[PendingMessage],
    producer: Any,
    unclaimed_after: timedelta,
    report: Report,
    by_running_task: bool,
) -> None:
    """One round trip: kombu's publish batch holds the messages (and their sent events)
    until its end, where Redis takes them as one pipeline and RabbitMQ confirms them all
    (``amqp_transport``). Only then are they accepted: a batch cut short by a broker error
    leaves every row of it to the relay, a copy of what did arrive is absorbed by the claim."""
    now = utcnow()
    sent: list[outbox_queries.Accepted] = []
    # kombu counts Redis commands (a message and its sent event are two): room for all. A
    # lone message (a ``.delay()``) goes without: setting a batch up costs more than it saves.
    alone = len(chunk) == 1
    batch = nullcontext() if alone else publisher.batch(producer, 4 * len(chunk))
    with batch:
        sender = (
            None
            if alone and by_running_task
            else batch_send.BatchSender(app, producer, by_running_task=by_running_task)
        )
        for message in chunk:
            if _send_or_refuse(app, message, now, producer, sender, report):
                wait = check_wait(message.publish_count, unclaimed_after)
                sent.append(
                    outbox_queries.Accepted(
                        message.id, message.publish_count, wait, message.available_at
                    )
                )
        if sender is not None:
            sender.flush_events()
    crashpoints.hit("after_publish_before_confirm")
    report.accepted.extend(sent)


def _send_or_refuse(
    app: Celery,
    message: PendingMessage,
    now: datetime,
    producer: Any,
    sender: batch_send.BatchSender | None,
    report: Report,
) -> bool:
    """Hand the message to the batch; False (reported) if it fails on its own."""
    try:
        send(app, message, now=now, producer=producer, sender=sender)
    except publisher.BROKER_ERRORS:
        raise
    except Exception as exc:  # noqa: BLE001 - the row's own fault: counted against the row
        report.refused.append((message.id, f"{type(exc).__name__}: {exc}"[:MAX_ERROR]))
        return False
    return True


def _log_refused(refused: Sequence[tuple[int, str]]) -> None:
    """One line per reason: a queue the broker holds with other arguments refuses every
    message of the run alike, and its reason is what the operator needs to read."""
    rows: dict[str, list[int]] = {}
    for outbox_id, error in refused:
        rows.setdefault(error, []).append(outbox_id)
    for error, ids in rows.items():
        shown = ", ".join(map(str, ids[:REFUSED_SHOWN]))
        more = f" (+{len(ids) - REFUSED_SHOWN} more)" if len(ids) > REFUSED_SHOWN else ""
        log.warning("outbox rows %s%s refused: %s", shown, more, error)


def mark(conn: Connection, accepted: Sequence[outbox_queries.Accepted]) -> None:
    if not accepted:
        return
    if conn.dialect.name == "postgresql" and not is_autocommit(conn):
        conn.exec_driver_sql("SET LOCAL synchronous_commit TO off")
    outbox_queries.mark_published(conn, accepted)


def _mark_in_own_transaction(engine: Engine, accepted: Sequence[outbox_queries.Accepted]) -> None:
    try:
        with engine.begin() as conn:
            mark(conn, accepted)
    except Exception as exc:  # noqa: BLE001 - an unmarked row is only republished
        log.warning("marking %d outbox rows published failed: %s", len(accepted), exc)


MARKER = marker.Marker(_mark_in_own_transaction)


def publish_now(
    app: Celery, messages: Sequence[PendingMessage], *, by_running_task: bool = True
) -> int:
    """The fast path after COMMIT; whatever fails here the relay publishes later
    (``by_running_task``: see ``publish``).

    While the broker failed a moment ago this does not even try (see ``publisher``). On
    PostgreSQL the accepted rows are marked in bulk by this process's marker; SQLite
    marks them here, as a second writer thread would only queue on its one write lock.
    A feature that holds messages back (a paused queue) does so through a filter
    registered on the app (``hooks``); a plain app has none.
    """
    for keep in hooks.publish_filters(app):
        messages = keep(app, messages)
    if not messages or not publisher.fast_path_open():
        return 0
    unclaimed_after = timedelta(seconds=get_settings().unclaimed_after)
    report = publish(
        app, messages, unclaimed_after=unclaimed_after, by_running_task=by_running_task
    )
    if report.broker_error is None:
        publisher.broker_answered()
    else:
        publisher.broker_failed()
    if report.accepted:
        _mark_soon(get_relaxed_engine(), report.accepted)
    return len(report.accepted)


def _mark_soon(engine: Engine, accepted: Sequence[outbox_queries.Accepted]) -> None:
    if engine.dialect.name == "postgresql":
        MARKER.add(engine, accepted)
    else:
        _mark_in_own_transaction(engine, accepted)


def publish_started(
    app: Celery, started: Sequence[PendingMessage], *, by_running_task: bool = True
) -> None:
    """The fast path for what a committed transition started (a workflow step's
    successors, a chord body's errbacks), due now on this process's clock; the relay
    otherwise. ``by_running_task``: see ``publish``."""
    if started:
        due = [on_local_clock(m, timedelta(0)) for m in started]
        publish_now(app, due, by_running_task=by_running_task)
