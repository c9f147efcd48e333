"""The queues page: per broker queue and domain, what waits in the journal and in the broker.

Journal depth and the oldest wait come from the oldest ``summary.ACTIVE_CAP`` queued rows
of each run table (``ix_<table>_state_updated``, in order): a deeper backlog reads
"10,000+", its queues counted in those rows; the rate counts the claims of the last ``RATE_WINDOW``
(``row_events.window``: event rows through ``ix_job_events_at``, the claims run rows carry
through ``ix_<table>_state_updated``). Broker depth is one passive declare per queue on
the process's pooled publish connection (``publisher.declared``; Redis: the lengths of the
queue's lists, priorities included; RabbitMQ: the queue's message count and consumers), so a
queue the broker does not know says so instead of being created.
Limited keys (``limit=N``, ``fair``) show their slots held and their runs waiting, from
``key_slots``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery import Celery
from sqlalchemy import Connection, Engine, func, or_, select

from jobsapp.db import utcnow
from jobsapp.lifecycle.journal import row_events
from jobsapp.lifecycle.journal.key_slots import SLOTS
from jobsapp.lifecycle.rules.states import State, Transition
from jobsapp.lifecycle.transport import publisher
from jobsapp.monitor import summary, workers
from jobsapp.monitor.summary import checked_tables

log = logging.getLogger(__name__)

RATE_WINDOW = timedelta(minutes=5)
KEY_LINES = 50


@dataclass(frozen=True)
class QueueRow:
    queue: str
    module: str
    # Queued and due now / queued for later (a retry's backoff, a countdown).
    due: int
    later: int
    oldest_due: datetime | None
    claims_per_minute: float
    # False: the module has more than ACTIVE_CAP queued runs; due and later count those read.
    exact: bool = True


@dataclass(frozen=True)
class BrokerDepth:
    messages: int | None
    consumers: int | None
    problem: str | None = None


@dataclass(frozen=True)
class KeyLine:
    """A limited key (``limit=N`` or ``fair``): its runs holding a slot, and those waiting."""

    module: str
    key: str
    limit: int
    holding: int
    waiting: int
    oldest_wait: datetime | None


@dataclass(frozen=True)
class QueuesView:
    rows: list[QueueRow]
    broker: dict[str, BrokerDepth]
    # Live workers consuming each queue (the registry); None: no worker ever registered.
    consumers: dict[str, int] | None
    # The busiest limited keys, most waiting first (at most ``KEY_LINES``).
    keys: list[KeyLine]


def queues_view(engine: Engine, app: Celery, default_queue: str) -> QueuesView:
    now = utcnow()
    with engine.connect() as conn:
        rows = journal_depths(conn, default_queue, now)
        consumers = _registry_consumers(conn, now)
        keys = key_lines(conn)
    names = sorted({r.queue for r in rows} | set(consumers or {}) | {default_queue})
    return QueuesView(rows, broker_depths(app, names), consumers, keys)


def key_lines(conn: Connection, limit: int = KEY_LINES) -> list[KeyLine]:
    """The limited keys with the longest lines, from ``key_slots`` alone (one small table:
    a row per active run of a limited key)."""
    modules = {spec.table.name: spec.module for spec in checked_tables(None)}
    s = SLOTS.c
    waiting = func.count() - func.count(s.slot_no)
    stmt = (
        select(
            s.run_table,
            s.concurrency_key,
            func.max(s.key_limit),
            func.count(s.slot_no),
            waiting,
            func.min(s.created_at).filter(s.slot_no.is_(None)),
        )
        .group_by(s.run_table, s.concurrency_key)
        .order_by(waiting.desc(), s.concurrency_key)
        .limit(limit)
    )
    return [
        KeyLine(modules.get(table, table), key, int(n), int(held), int(wait), oldest)
        for table, key, n, held, wait, oldest in conn.execute(stmt)
    ]


def journal_depths(conn: Connection, default_queue: str, now: datetime) -> list[QueueRow]:
    rates = _claims(conn, now)
    found: list[QueueRow] = []
    for spec in checked_tables(None):
        t = summary.oldest_active(spec.table, State.QUEUED.value, "queue")
        due = or_(t.c.next_retry_at.is_(None), t.c.next_retry_at <= now)
        stmt = select(
            t.c.queue,
            func.count().filter(due),
            func.count().filter(~due),
            func.min(t.c.updated_at).filter(due),
        ).group_by(t.c.queue)
        read = conn.execute(stmt).all()
        exact = sum(n_due + n_later for _, n_due, n_later, _ in read) < summary.ACTIVE_CAP
        for queue, n_due, n_later, oldest in read:
            name = queue or default_queue
            rate = rates.get((spec.module, queue), 0) / (RATE_WINDOW.total_seconds() / 60)
            found.append(QueueRow(name, spec.module, n_due, n_later, oldest, rate, exact))
        found += _idle(
            spec.module, rates, {r.queue for r in found if r.module == spec.module}, default_queue
        )
    return sorted(found, key=lambda r: (r.queue, r.module))


def _idle(
    module: str, rates: dict[tuple[str, str | None], int], listed: set[str], default: str
) -> list[QueueRow]:
    """Queues with claims in the window but nothing queued now: their rate still shows."""
    window = RATE_WINDOW.total_seconds() / 60
    mine = [(q or default, n) for (m, q), n in rates.items() if m == module]
    return [QueueRow(q, module, 0, 0, None, n / window) for q, n in mine if q not in listed]


def _claims(conn: Connection, now: datetime) -> dict[tuple[str, str | None], int]:
    """Claims in ``RATE_WINDOW`` by (module, queue): the window's claims (event rows and
    those the run rows carry), joined to their runs."""
    found: dict[tuple[str, str | None], int] = {}
    claims = row_events.window(now - RATE_WINDOW, [Transition.CLAIM.value])
    for spec in checked_tables(None):
        t = spec.table
        stmt = (
            select(t.c.queue, func.count())
            .select_from(claims.join(t, t.c.job_id == claims.c.job_id))
            .where(claims.c.module == spec.module)
            .group_by(t.c.queue)
        )
        for queue, n in conn.execute(stmt):
            found[(spec.module, queue)] = int(n)
    return found


def _registry_consumers(conn: Connection, now: datetime) -> dict[str, int] | None:
    alive = [w for w in workers.registered(conn, now) if w.status == "alive"]
    if not alive and not workers.any_registered(conn):
        return None
    counts: dict[str, int] = {}
    for w in alive:
        for q in w.queues:
            counts[q] = counts.get(q, 0) + 1
    return counts


def broker_depths(app: Celery, names: Iterable[str]) -> dict[str, BrokerDepth]:
    """Messages waiting in the broker per queue (a passive declare: nothing is created), on
    the process's pooled publish connection: a page load opens none of its own."""
    try:
        found = publisher.declared(app, names)
    except Exception as exc:  # noqa: BLE001 - a broker that is down is a cell, not a 500
        log.warning("queues page: broker unavailable (%s)", type(exc).__name__)
        return {n: BrokerDepth(None, None, "broker unavailable") for n in names}
    return {
        name: BrokerDepth(None, None, "not declared on the broker")
        if d is None
        else BrokerDepth(d.messages, d.consumers)
        for name, d in found.items()
    }
