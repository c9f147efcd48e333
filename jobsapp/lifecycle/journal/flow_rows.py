"""Flow control's statements: a rate limit's token, a delivery handed back, pauses.

``take_token`` is one guarded upsert of ``flow_rates`` in the claim's transaction (the
claim and the token commit or roll back together); ``reserve`` gives a run that must wait
for its rate a start of its own; ``hand_back`` puts a delivery that flow
control refused back in the journal (no attempt taken: the run stays queued at its
attempt, its outbox row pending again); ``pause`` and ``resume`` write ``flow_pauses`` with
their ``flow_actions`` audit row. No transition of ``states.ALLOWED``: a handed-back run
never left ``queued``. Called by lifecycle/flow/gating.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import timedelta
from functools import cache
from typing import Any

from sqlalchemy import (
    Connection,
    Float,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from jobsapp.db import utcnow
from jobsapp.lifecycle.journal._sql import OUTBOX, _require_transaction, upsert
from jobsapp.lifecycle.journal.clock import clock
from jobsapp.lifecycle.journal.flow_tables import ACTIONS, PAUSES, RATES
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules.states import State

PAUSE, RESUME = "pause", "resume"


# The host's clock in epoch seconds, bound (SQLite's ``_epoch`` in a prebuilt statement).
_AT = bindparam("at", type_=Float())


def _epoch(conn: Connection) -> Any:
    """Now in epoch seconds: PostgreSQL's now(), the transaction's (the claim's
    ``started_at`` too), or the host's on SQLite."""
    if conn.dialect.name == "postgresql":
        return func.extract("epoch", func.now())
    return literal(utcnow().timestamp())


def take_token(conn: Connection, task: str, key: str, interval: float) -> float | None:
    """Start one run of (``task``, ``key``) now if its rate allows: None when it does
    (the next start moves ``interval`` seconds on), else the seconds until it will."""
    take, wait = _token_statements(conn.dialect.name)
    params = {"task": task, "key": key, "interval": interval}
    if conn.dialect.name != "postgresql":
        params["at"] = utcnow().timestamp()
    if conn.execute(take, params).first() is not None:
        return None
    return max(0.0, float(conn.execute(wait, params).scalar_one()))


@cache
def _token_statements(dialect: str) -> tuple[Any, Any]:
    """``take_token``'s upsert and its read of the wait, built once per dialect (every
    claim of a rated task runs them): the clock as ``_epoch`` reads it, the rest bound."""
    now = func.extract("epoch", func.now()) if dialect == "postgresql" else _AT
    task = bindparam("task", type_=RATES.c.task_name.type)
    key = bindparam("key", type_=RATES.c.rate_key.type)
    later = now + bindparam("interval", type_=Float())
    upsert = pg_insert(RATES) if dialect == "postgresql" else sqlite_insert(RATES)
    # Guarded by the time the next start is allowed: concurrent claims serialise on the
    # row, and each re-reads it, so starts are at least ``interval`` apart on one clock.
    take = (
        upsert.values(task_name=task, rate_key=key, next_at=later)
        .on_conflict_do_update(
            index_elements=[RATES.c.task_name, RATES.c.rate_key],
            set_={"next_at": later},
            where=RATES.c.next_at <= now,
        )
        .returning(RATES.c.next_at)
    )
    wait = select(RATES.c.next_at - now).where(RATES.c.task_name == task, RATES.c.rate_key == key)
    return take, wait


def reserve(conn: Connection, task: str, key: str, interval: float) -> float:
    """A start for a run handed back to wait for its rate: the first not reserved yet, at
    or after the next allowed one; returns the seconds until it. Guarded by the row's lock:
    each reservation moves ``reserved_at`` one interval on."""
    now = _epoch(conn)
    start = func.greatest(func.coalesce(RATES.c.reserved_at, 0.0), RATES.c.next_at, now)
    if conn.dialect.name != "postgresql":
        start = func.max(func.coalesce(RATES.c.reserved_at, 0.0), RATES.c.next_at, now)
    stmt = (
        update(RATES)
        .where(RATES.c.task_name == task, RATES.c.rate_key == key)
        .values(reserved_at=start + interval)
        .returning(RATES.c.reserved_at - interval - now)
    )
    found = conn.execute(stmt).scalar()
    return max(0.0, float(found or 0.0))


def hand_back(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    attempt: int,
    *,
    delay: timedelta | None,
) -> bool:
    """A delivery of ``attempt`` that flow control refused goes back to the journal: its
    outbox row pending again (due after ``delay``, or now: a paused queue's relay holds
    it), and with a ``delay`` the run waits for it (``next_retry_at``). Only while the run
    is queued before that attempt; False when it is not (nothing written)."""
    _require_transaction(conn, "hand_back")
    t = spec.table
    now = clock(conn)
    due = now if delay is None else now + delay
    waiting = (t.c.job_id == job_id, t.c.state == State.QUEUED.value, t.c.attempts == attempt - 1)
    if delay is not None:
        held = update(t).where(*waiting).values(next_retry_at=due, updated_at=now)
        if conn.execute(held).rowcount == 0:
            return False
    o = OUTBOX.c
    back = (
        update(OUTBOX)
        .where(
            o.module == spec.module,
            o.job_id == job_id,
            o.attempt == attempt,
            o.dead_at.is_(None),
            o.delivered_at.is_(None),
            select(t.c.job_id).where(*waiting).exists(),
        )
        # A publish not marked yet (the producer's marker batches its marks) is counted
        # here, so that its late mark, guarded by the count it saw, leaves the row pending.
        .values(
            published_at=None,
            available_at=due,
            publish_count=case(
                (o.published_at.is_(None), o.publish_count + 1), else_=o.publish_count
            ),
        )
    )
    return conn.execute(back).rowcount > 0


def pause(conn: Connection, kind: str, name: str, *, actor: str, reason: str) -> bool:
    """Pause a queue or a domain; False when it was paused already (nothing written)."""
    now = clock(conn)
    stmt = upsert(conn, PAUSES).values(
        kind=kind, name=name, paused_at=now, paused_by=actor, reason=reason
    )
    added = conn.execute(stmt.on_conflict_do_nothing().returning(PAUSES.c.name)).first()
    if added is not None:
        _audit(conn, PAUSE, kind, name, actor=actor, reason=reason, now=now)
    return added is not None


def resume(conn: Connection, kind: str, name: str, *, actor: str, reason: str) -> bool:
    """Resume a paused queue or domain; False when it was not paused (nothing written)."""
    now = clock(conn)
    gone = conn.execute(delete(PAUSES).where(PAUSES.c.kind == kind, PAUSES.c.name == name))
    if gone.rowcount:
        _audit(conn, RESUME, kind, name, actor=actor, reason=reason, now=now)
    return bool(gone.rowcount)


def _audit(
    conn: Connection, action: str, kind: str, name: str, *, actor: str, reason: str, now: Any
) -> None:
    conn.execute(
        insert(ACTIONS).values(
            action=action, kind=kind, name=name, actor=actor, reason=reason, at=now
        )
    )


def paused(conn: Connection) -> list[dict[str, Any]]:
    """Every paused queue and domain, oldest pause first."""
    rows = conn.execute(select(PAUSES).order_by(PAUSES.c.paused_at)).mappings()
    return [dict(r) for r in rows]


def any_paused(conn: Connection, pairs: Collection[tuple[str, str]]) -> bool:
    """Whether one of the (kind, name) ``pairs`` is paused now."""
    stmt = select(PAUSES.c.name).where(tuple_(PAUSES.c.kind, PAUSES.c.name).in_(list(pairs)))
    return conn.execute(stmt.limit(1)).first() is not None


def not_paused(module: Any, queue: Any, default_queue: str) -> Any:
    """A filter over rows with a ``module`` and a ``queue`` column (NULL: the app's
    default queue): true where neither is paused. For the relay's reads."""
    p = PAUSES.c
    named = ((p.kind == "domain") & (p.name == module)) | (
        (p.kind == "queue") & (p.name == func.coalesce(queue, default_queue))
    )
    return ~select(p.name).where(named).exists()


def audit_trail(conn: Connection, *, limit: int) -> list[dict[str, Any]]:
    """The newest pauses and resumes first."""
    stmt = select(ACTIONS).order_by(ACTIONS.c.id.desc()).limit(limit)
    return [dict(r) for r in conn.execute(stmt).mappings()]


def rate_state(conn: Connection, tasks: Collection[str]) -> dict[str, tuple[int, float]]:
    """Per rate-limited task: the rate keys it has started runs under, and the latest
    next allowed start among them (epoch seconds)."""
    stmt = (
        select(RATES.c.task_name, func.count(), func.max(RATES.c.next_at))
        .where(RATES.c.task_name.in_(list(tasks)))
        .group_by(RATES.c.task_name)
    )
    return {str(t): (int(n), float(at)) for t, n, at in conn.execute(stmt)}
