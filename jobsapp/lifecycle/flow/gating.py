"""Flow control on the claim path: global rate limits, paused queues and domains.

A claim that flow control may refuse runs in a transaction with its gate (``gated_claim``):
the guarded claim, then the gate's checks (journal/flow_rows.py); a refusal rolls the claim
back, so no attempt is taken, and the delivery is handed back to the journal
(``hand_back``): its outbox row is pending again, and the relay publishes it when the rate
allows (the run waits with ``next_retry_at``) or when its queue is resumed. A claim nothing
can refuse (no rate, nothing paused) keeps the one-statement path.

The checks: the rate of a task that declares one, and the holds its app registered at setup
(worker/claim.py's ``add_claim_hold``: the pause hold, ``while_paused``, on the deployment's
app and on any app a lifecycle task joins). A task with no rate on an app with no hold has
no gate, and its claim enters no module of flow control.

Which queues are paused is read from the database at most every ``PAUSES_SEEN_WITHIN``
seconds per process; ``pause`` waits that long before it returns, so once it has
returned no worker starts a run of the paused queue (docs/flow-control.md).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import re
import string
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from celery import Celery
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from jobsapp.db import get_engine, relaxed_autocommit
from jobsapp.lifecycle.journal import PendingMessage, Run
from jobsapp.lifecycle.journal import flow_rows as statements
from jobsapp.lifecycle.journal.registry import RunTable

log = logging.getLogger(__name__)

MAX_RATE_KEY = 200  # flow_rates.rate_key
# How stale a process's view of the paused queues may be.
PAUSES_SEEN_WITHIN = 1.0
# What that view ages by (a test moves it).
_clock: Callable[[], float] = time.monotonic
_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*$")


class Kind(StrEnum):
    QUEUE = "queue"
    DOMAIN = "domain"


@dataclass(frozen=True)
class Rate:
    """At most ``count`` starts in any ``period`` seconds, spaced evenly."""

    count: int
    period: float

    @property
    def interval(self) -> float:
        return self.period / self.count


def check_declared(cls: type) -> None:
    """Refuse Celery's ``rate_limit`` (a cap per worker process: celery#5732) and check
    ``rate`` and ``rate_key`` where a task class is declared, not at its first run."""
    name = cls.__dict__.get("name", cls.__name__)
    if cls.__dict__.get("rate_limit"):
        raise TypeError(
            f"{name}: rate_limit is per worker process in Celery; use rate='100/m', "
            "global across workers"
        )
    if rate := cls.__dict__.get("rate"):
        parse_rate(rate)
    if (template := cls.__dict__.get("rate_key")) and "run" in cls.__dict__:
        named = set(inspect.signature(cls.__dict__["run"]).parameters) | {"concurrency_key"}
        if unknown := {f for _, f, _, _ in string.Formatter().parse(template) if f} - named:
            raise TypeError(f"{name}: rate_key names {sorted(unknown)}, not arguments of the task")


def parse_rate(text: str) -> Rate:
    """``"100/m"``, ``"10/s"``, ``"5/30s"`` (five per thirty seconds), ``"1000/h"``, ``"3/d"``."""
    found = _RATE.match(text)
    if found is None or int(found[1]) < 1:
        raise ValueError(f"rate {text!r}: write N/s, N/m, N/h, N/d or N/<k><unit>, N >= 1")
    return Rate(int(found[1]), int(found[2] or 1) * _PERIODS[found[3]])


@dataclass(frozen=True)
class Held:
    """A claim flow control refused: ``delay`` seconds until the rate allows a start (of
    ``rate_key``), or None for a paused queue or domain."""

    delay: float | None
    rate_key: str = ""


# Run in the claim's transaction on the claimed row: a refusal, or None to let it start.
Check = Callable[[Connection, RunTable, "Gate", Run], Held | None]
# Asked before each claim: the check the claim must pass now, or None when it cannot refuse.
Hold = Callable[[Engine, "Gate"], Check | None]


@dataclass(frozen=True)
class Gate:
    """What flow control checks before a task's run starts."""

    task: str
    default_queue: str
    rate: Rate | None = None
    # The rate key of a claimed run (its row): "" for one rate over the whole task.
    rate_key: Callable[[Run], str] = lambda _run: ""
    # The holds the task's app registered (worker/claim.py), in the order they check.
    holds: tuple[Hold, ...] = ()


class _Undo(Exception):
    """Rolls back the transaction it leaves: a refused claim, a reservation not used."""

    def __init__(self, held: Held) -> None:
        super().__init__("flow control undid the transaction")
        self.held = held


Claim = Callable[[Connection], Run | None]


def armed(engine: Engine, gate: Gate) -> list[Check]:
    """The checks a claim through ``gate`` must pass now: its holds' (a pause anywhere),
    then its rate's."""
    checks = [check for hold in gate.holds if (check := hold(engine, gate)) is not None]
    if gate.rate is not None:
        checks.append(_within_rate)
    return checks


def gates(engine: Engine, gate: Gate) -> bool:
    """Whether a claim through ``gate`` may be refused now."""
    return bool(armed(engine, gate))


def gated_claim(engine: Engine, spec: RunTable, gate: Gate, claim: Claim) -> Run | Held | None:
    """``claim`` (one guarded statement) with the gate's checks in its transaction."""
    checks = armed(engine, gate)
    if not checks:
        with relaxed_autocommit(engine) as conn:
            return claim(conn)
    try:
        with engine.begin() as conn:
            _without_flush_wait(conn)
            row = claim(conn)
            held = None if row is None else _first_held(conn, spec, gate, row, checks)
            if held is not None:
                raise _Undo(held)  # the claim and the token roll back
            return row
    except _Undo as undo:
        return undo.held


def _without_flush_wait(conn: Connection) -> None:
    """As the ungated claim's commit: a claim a database crash lost is caught by its
    fence, and its token goes with it (docs/flow-control.md)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL synchronous_commit TO off")


def _first_held(
    conn: Connection, spec: RunTable, gate: Gate, row: Run, checks: Sequence[Check]
) -> Held | None:
    for check in checks:
        if (held := check(conn, spec, gate, row)) is not None:
            return held
    return None


def while_paused(engine: Engine, gate: Gate) -> Check | None:
    """The pause hold an app registers at setup (worker/claim.py's ``add_claim_hold``):
    while this process sees a pause anywhere, the claim reads, in its transaction, whether
    its run's queue or domain is paused."""
    del gate
    return _unpaused if paused_pairs(engine) else None


def _unpaused(conn: Connection, spec: RunTable, gate: Gate, row: Run) -> Held | None:
    pausing = _pairs(spec.module, row.queue, gate.default_queue)
    return Held(None) if statements.any_paused(conn, pausing) else None


def _within_rate(conn: Connection, spec: RunTable, gate: Gate, row: Run) -> Held | None:
    del spec
    assert gate.rate is not None, "only a gate with a rate checks it"
    key = _bounded(gate.rate_key(row))
    wait = statements.take_token(conn, gate.task, key, gate.rate.interval)
    return None if wait is None else Held(wait, key)


def _bounded(key: str) -> str:
    """A rate key that fits its column: a long one is named by its digest."""
    return key if len(key) <= MAX_RATE_KEY else hashlib.sha256(key.encode()).hexdigest()


def _pairs(module: Any, queue: str | None, default_queue: str) -> set[tuple[str, str]]:
    """What pauses a run of ``module`` on ``queue`` (None: the app's default queue)."""
    return {(Kind.DOMAIN.value, module), (Kind.QUEUE.value, queue or default_queue)}


def publishable(
    engine: Engine, default_queue: Callable[[], str], messages: Sequence[PendingMessage]
) -> Sequence[PendingMessage]:
    """The producer's fast path leaves the messages of a paused queue or domain (as this
    process last saw the pauses) to the relay, which holds them until the resume. The
    enqueue has committed: a database that cannot say what is paused leaves the messages
    to the workers' gate rather than fail the caller. The default queue (a Celery
    settings lookup) is read only while something is paused."""
    try:
        pairs = paused_pairs(engine)
    except DBAPIError as down:
        log.warning(
            "pauses unreadable (%s); publishing, the workers' gate holds back what is paused",
            type(down.orig).__name__,
        )
        return messages
    if not pairs:
        return messages
    queue = default_queue()
    return [m for m in messages if pairs.isdisjoint(_pairs(m.body.get("module"), m.queue, queue))]


def held_while_paused(app: Celery, messages: Sequence[PendingMessage]) -> Sequence[PendingMessage]:
    """``publishable`` as the publish filter an app registers at setup
    (transport/hooks.py; jobsapp.celery_app registers it on the deployment's app)."""
    return publishable(get_engine(), lambda: str(app.conf.task_default_queue), messages)


def hand_back(
    engine: Engine, spec: RunTable, gate: Gate, job_id: uuid.UUID, attempt: int, held: Held
) -> bool:
    """The refused delivery back to the journal (the caller then acks its message). A run
    over its rate waits for a start reserved for it, so a backlog is published one start
    after another, not all of it at every start."""
    try:
        with engine.begin() as conn:
            delay = None
            if held.delay is not None and gate.rate is not None:
                seconds = statements.reserve(conn, gate.task, held.rate_key, gate.rate.interval)
                delay = timedelta(seconds=seconds)
            if not statements.hand_back(conn, spec, job_id, attempt, delay=delay):
                raise _Undo(held)  # the run moved on: its reservation rolls back
    except _Undo:
        return False
    return True


# ------------------------------------------------------------------ pauses


# By engine: naming it by its URL (str(engine.url)) cost more than the rest of the look.
_seen: dict[Engine, tuple[float, frozenset[tuple[str, str]]]] = {}
_seen_lock = threading.Lock()


def paused_pairs(engine: Engine) -> frozenset[tuple[str, str]]:
    """The paused (kind, name) pairs, as read at most ``PAUSES_SEEN_WITHIN`` seconds ago."""
    with _seen_lock:
        seen = _seen.get(engine)
    read_at = _clock()
    if seen is not None and seen[0] > read_at:
        return seen[1]
    with engine.connect() as conn:
        pairs = frozenset((r["kind"], r["name"]) for r in statements.paused(conn))
    # Aged from before the read: a pause that commits while the read runs may be missing
    # from it, and must still be seen PAUSES_SEEN_WITHIN after its commit at the latest.
    with _seen_lock:
        _seen[engine] = (read_at + PAUSES_SEEN_WITHIN, pairs)
    return pairs


def pause(engine: Engine, kind: Kind, name: str, *, actor: str, reason: str) -> bool:
    """Pause a queue or a domain (audited); returns once every process sees it. False:
    it was paused already."""
    with engine.begin() as conn:
        done = statements.pause(conn, kind.value, name, actor=actor, reason=reason)
    time.sleep(PAUSES_SEEN_WITHIN)
    return done


def resume(engine: Engine, kind: Kind, name: str, *, actor: str, reason: str) -> bool:
    """Resume a paused queue or domain (audited): the relay publishes what waited at its
    next tick. False: it was not paused."""
    with engine.begin() as conn:
        return statements.resume(conn, kind.value, name, actor=actor, reason=reason)


def paused(engine: Engine) -> list[dict[str, Any]]:
    """Every paused queue and domain, read now."""
    with engine.connect() as conn:
        return statements.paused(conn)
