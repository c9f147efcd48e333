"""Claiming a run before the body: queued -> running, or a reasoned no-op ack.

The statements are journal/claiming.py's (Transition.CLAIM); this module decides what a refused
claim means, waits for an early message, and journals Transition.SKIP for a held key. Flow
control (lifecycle/flow/gating.py) may refuse a claim that matched, for a paused queue or a
rate: the claim rolls back and the delivery is handed back to the journal
(docs/flow-control.md). It enters the claim only through a task's gate: the task's own rate,
and the holds its app registered at setup (``add_claim_hold``, as the publish side's
transport/hooks.py); a task with neither claims with one statement and no flow code.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from celery import Celery
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError

from jobsapp.db import autocommit, relaxed_autocommit, utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.flow import gating
from jobsapp.lifecycle.journal import Run
from jobsapp.lifecycle.journal.key_slots import PARKED
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules.errors import InvalidMessage
from jobsapp.lifecycle.rules.message import Envelope
from jobsapp.lifecycle.rules.states import Outcome, Transition, is_terminal

log = logging.getLogger(__name__)


class Refusal(StrEnum):
    """Why a delivered message starts no work (each is acked)."""

    NO_ROW = "no journal row: the enqueue rolled back or the row was pruned"
    TERMINAL = "the job is already terminal"
    # Also terminal, and this attempt's own end was earlier or never came (``_terminal``).
    REQUEUED = "the job is already terminal; this attempt was requeued before it ended"
    UNSTARTED = "the job is already terminal; it ended before this attempt started"
    STALE_ATTEMPT = "a duplicate of an attempt that already started"
    IN_FLIGHT = "the same attempt is running elsewhere"
    EARLY = "the attempt is not due yet; the relay publishes it when it is"
    WAITING = "its limited key's slots are all held; it is published when one frees"
    AHEAD = "the message names an attempt the journal never scheduled"
    SKIPPED = "another run holds the concurrency key"
    EXPIRED = "the job expired before it started"
    PAUSED = "its queue or domain is paused; the relay publishes it on resume"
    THROTTLED = "over its rate limit; the relay publishes it when the rate allows"


# What a delivery that started no work returns as its Celery result, before the reason.
NOT_RUN = "not run: "


def not_run(refusal: Refusal) -> str:
    """What a delivery that started no work returns as its Celery result."""
    return f"{NOT_RUN}{refusal.value}"


def explain(row: Run | None, attempt: int) -> Refusal:
    """Why the guarded claim matched nothing (pure; ``row`` read after the claim)."""
    if row is None:
        return Refusal.NO_ROW
    if is_terminal(row.state):
        return _terminal(row, attempt)
    if attempt == row.attempts and row.state == "running":
        return Refusal.IN_FLIGHT
    if attempt <= row.attempts:
        return Refusal.STALE_ATTEMPT
    if attempt > row.attempts + 1:
        return Refusal.AHEAD
    return Refusal.WAITING if row.next_retry_at == PARKED else Refusal.EARLY


def _terminal(row: Run, attempt: int) -> Refusal:
    """Terminal wins over every attempt number; which terminal refusal says how the
    delivered attempt itself ended, for Flower (``celery_view``): a broker's copy of an
    attempt that was requeued, or that never started, must not leave its task RECEIVED."""
    if attempt > row.attempts:
        return Refusal.EXPIRED if row.outcome == Outcome.EXPIRED else Refusal.UNSTARTED
    if attempt < row.attempts or _ended_queued(row):
        return Refusal.REQUEUED
    return Refusal.TERMINAL


def _ended_queued(row: Run) -> bool:
    """Whether the run ended while queued, after its last attempt was requeued: an expiry,
    or a cancel no running attempt was asked to honour (its worker's and the reaper's
    cancels follow a request, ``cancel_requested_at``)."""
    return row.outcome == Outcome.EXPIRED or (
        row.outcome == Outcome.CANCELLED and row.cancel_requested_at is None
    )


class LostClaim(StrEnum):
    """How a claim that never reached the disk (a database crash lost it) shows in its row."""

    UNCLAIMED = "the run is queued before its attempt again"
    RECLAIMED = "another claim took the same attempt"


def claim_lost(row: Run | None, attempt: int, token: uuid.UUID) -> LostClaim | None:
    """After a refused write of the claim ``token`` of ``attempt``: whether that claim was
    lost (pure). A reaper's requeue keeps ``attempts`` at the taken attempt, and the claim
    after it takes the next one, so neither looks like this; only a second claim of the
    same attempt carries the same number under another token."""
    if row is None:
        return None
    if row.state == "queued" and row.attempts == attempt - 1:
        return LostClaim.UNCLAIMED
    if row.attempts == attempt and row.claim_token != token:
        return LostClaim.RECLAIMED
    return None


def is_expired(row: Run | None, db_now: datetime) -> bool:
    """Whether a refused claim met a queued run past its ``expires_at`` (pure)."""
    if row is None or row.state != "queued" or row.expires_at is None:
        return False
    return bool(row.expires_at <= db_now)


def seconds_early(row: Run, db_now: datetime) -> float:
    """How long before its ``next_retry_at`` an early message came (pure)."""
    due = row.next_retry_at
    return 0.0 if due is None else max(0.0, (due - db_now).total_seconds())


def foreign_refusal(attempt: int) -> Refusal | None:
    """A message with no row starts attempt 1, by the rule for a row with no attempt yet
    (pure): a later attempt is one the journal never scheduled, whatever the ceiling."""
    return None if attempt == 1 else Refusal.AHEAD


# On the app itself (as transport/hooks.py keeps the publish filters): two apps in one
# process keep their own holds.
_HOLDS = "_jobsapp_claim_holds"


def add_claim_hold(app: Celery, hold: gating.Hold) -> None:
    """Register ``hold`` on the claims of ``app``'s tasks (once: a second call changes
    nothing). A new tuple each time, so a gate built with the old one sees it changed."""
    holds: tuple[gating.Hold, ...] = app.__dict__.get(_HOLDS, ())
    if hold not in holds:
        app.__dict__[_HOLDS] = (*holds, hold)


def claim_holds(app: Celery) -> tuple[gating.Hold, ...]:
    """The holds registered on ``app``, in the order they check; empty for a plain app."""
    holds: tuple[gating.Hold, ...] = app.__dict__.get(_HOLDS, ())
    return holds


@dataclass(frozen=True)
class Claimed:
    row: Run


@dataclass(frozen=True)
class Early:
    seconds: float


def claim(
    engine: Engine,
    spec: RunTable,
    env: Envelope,
    *,
    foreign: journal.NewJob | None,
    worker: str,
    wait_early: float = 0.0,
    gate: gating.Gate | None = None,
    due_now: bool = False,
) -> Claimed | Refusal:
    """Take the run for ``env.attempt``; ``foreign`` is the row to insert if none exists.

    A message at most ``wait_early`` seconds early on the database's clock (a countdown is
    counted on the publisher's clock, an ETA on this worker's) waits and claims when due;
    so does one whose rate limit (``gate``) allows it within that time. ``due_now`` (an
    ``apply()``): an early attempt is made due at once instead, as Celery's eager call
    retries at once and ignores a countdown.
    """

    def once() -> Tried:
        return _claim_once(engine, spec, env, foreign=foreign, worker=worker, gate=gate)

    outcome = once()
    if isinstance(outcome, Early) and due_now and _brought_forward(engine, spec, env, worker):
        outcome = once()
    if isinstance(outcome, Early) and outcome.seconds <= wait_early:
        log.info(
            "job %s attempt %s came %.2fs early; waiting", env.job_id, env.attempt, outcome.seconds
        )
        time.sleep(outcome.seconds)
        outcome = once()
    outcome = _wait_for_rate(outcome, once, wait_early)
    if isinstance(outcome, gating.Held):
        return _hand_back(engine, spec, env, outcome, gate)
    return Refusal.EARLY if isinstance(outcome, Early) else outcome


Tried = Claimed | Refusal | Early | gating.Held
EAGER_RUN_NOW = "apply() runs each attempt at once, as Celery's eager call does"


def _brought_forward(engine: Engine, spec: RunTable, env: Envelope, worker: str) -> bool:
    """The attempt's wait (a backoff, a countdown) ended now, audited as a run now."""
    with engine.begin() as conn:
        moved = journal.bring_forward(
            conn,
            spec,
            env.job_id,
            attempts=env.attempt - 1,
            actor=worker,
            reason=EAGER_RUN_NOW,
            now=utcnow(),
        )
    return moved is not None


def _wait_for_rate(outcome: Tried, again: Callable[[], Tried], budget: float) -> Tried:
    """A start the rate allows within ``budget`` seconds is waited for here, as an early
    message is; competing workers may take it first, so each wait is followed by a claim."""
    deadline = time.monotonic() + budget
    while (
        isinstance(outcome, gating.Held)
        and outcome.delay is not None
        and (outcome.delay <= deadline - time.monotonic())
    ):
        time.sleep(outcome.delay)
        outcome = again()
    return outcome


def _hand_back(
    engine: Engine, spec: RunTable, env: Envelope, held: gating.Held, gate: gating.Gate | None
) -> Refusal:
    """No attempt taken: the run waits in the journal, its message is acked."""
    assert gate is not None, "only a gate holds a claim back"
    if not gating.hand_back(engine, spec, gate, env.job_id, env.attempt, held):
        log.info("job %s attempt %s: moved on before it was handed back", env.job_id, env.attempt)
    return Refusal.PAUSED if held.delay is None else Refusal.THROTTLED


def _claim_once(
    engine: Engine,
    spec: RunTable,
    env: Envelope,
    *,
    foreign: journal.NewJob | None,
    worker: str,
    gate: gating.Gate | None = None,
) -> Tried:
    # The claim's commit does not wait for the WAL flush (gated or not): the next commit
    # that waits flushes it (the finish's, unless JOBSAPP_FINISH_FLUSH=no-wait); one lost
    # in a crash is caught by the claim token's fence, and named by ``claim_lost`` after
    # the refused write.
    row = taken(
        engine,
        spec,
        gate,
        lambda conn: journal.claim(conn, spec, env.job_id, env.attempt, worker=worker),
    )
    if row is None:
        return _refused(engine, spec, env, foreign=foreign, worker=worker, gate=gate)
    return row if isinstance(row, gating.Held) else Claimed(row)


def taken(
    engine: Engine, spec: RunTable, gate: gating.Gate | None, take: gating.Claim
) -> Run | gating.Held | None:
    """The claim statement ``take``, through the gate when the task has one."""
    if gate is None:
        with relaxed_autocommit(engine) as conn:
            return take(conn)
    return gating.gated_claim(engine, spec, gate, take)


def _refused(
    engine: Engine,
    spec: RunTable,
    env: Envelope,
    *,
    foreign: journal.NewJob | None,
    worker: str,
    gate: gating.Gate | None,
) -> Tried:
    """Why the claim matched nothing; or the claim of a foreign message that has no row."""
    with autocommit(engine) as conn:
        current, db_now = journal.load_with_clock(conn, spec, env.job_id)
    if is_expired(current, db_now):
        return _expire(engine, spec, env, worker)
    if current is None and foreign is not None:
        if refused := foreign_refusal(env.attempt):
            return refused
        if foreign.key_limit is not None or (gate is not None and gating.gates(engine, gate)):
            return _adopt(engine, spec, env, foreign, worker, gate)
        with autocommit(engine) as conn:
            return _claim_foreign(conn, foreign, env, worker)
    refusal = explain(current, env.attempt)
    if refusal is Refusal.EARLY and current is not None:
        return Early(seconds_early(current, db_now))
    return refusal


def _adopt(
    engine: Engine,
    spec: RunTable,
    env: Envelope,
    job: journal.NewJob,
    worker: str,
    gate: gating.Gate | None,
) -> Tried:
    """A foreign message that flow control or its key's limit may hold back: its run is
    journaled as queued first (a limited key's run joins its key's line, as an enqueue's
    does), then claimed through the gate like any run, so a pause or a rate hands it back
    to the journal and a key with no free slot leaves it waiting, parked (its pending
    outbox row is published later: a copy the claim's guard refuses if this claim took
    the run)."""
    with engine.begin() as conn:
        adopted = journal.enqueue(conn, job, actor=worker)
    if adopted.outcome is journal.EnqueueOutcome.SKIPPED:
        log.info(
            "job %s: concurrency key %s held by job %s",
            env.job_id,
            job.concurrency_key,
            adopted.holder,
        )
        return Refusal.SKIPPED
    return _claim_once(engine, spec, env, foreign=None, worker=worker, gate=gate)


def _expire(engine: Engine, spec: RunTable, env: Envelope, worker: str) -> Refusal:
    """The delivery of an expired run records the expiry instead of running it (whoever
    wrote it first, this worker or the reaper, the run is expired)."""
    with engine.begin() as conn:
        if journal.expire(conn, spec, env.job_id, actor=worker):
            log.info("job %s expired before attempt %s started", env.job_id, env.attempt)
    return Refusal.EXPIRED


def _claim_foreign(
    conn: Connection, job: journal.NewJob, env: Envelope, worker: str
) -> Claimed | Refusal:
    try:
        row = journal.claim_by_insert(conn, job, env.attempt, worker=worker)
    except IntegrityError:
        # A foreign key refused the row: the ids name nothing this domain knows.
        raise InvalidMessage("the message names nothing to run on") from None
    if row is not None:
        return Claimed(row)
    mine = journal.load(conn, job.spec, job.job_id)
    if mine is not None:
        # The job_id conflicted, not the key: another copy of this message claimed it.
        return explain(mine, env.attempt)
    holder = journal.active_holder(conn, job.spec, job.concurrency_key)
    journal.record_event(
        conn,
        job.spec,
        job.job_id,
        env.attempt,
        Transition.SKIP,
        from_state=None,
        to_state=None,
        actor=worker,
        reason=f"concurrency key {job.concurrency_key} held by job {holder}",
    )
    return Refusal.SKIPPED
