"""Claiming a run before the body: queued -> running, or a reasoned no-op ack."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError

from jobsapp.db import autocommit, utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.errors import InvalidMessage
from jobsapp.lifecycle.message import Envelope
from jobsapp.lifecycle.registry import RunTable
from jobsapp.lifecycle.states import Transition, is_terminal

log = logging.getLogger(__name__)


class Refusal(StrEnum):
    """Why a delivered message starts no work (each is acked)."""

    NO_ROW = "no journal row: the enqueue rolled back or the row was pruned"
    TERMINAL = "the job is already terminal"
    STALE_ATTEMPT = "a duplicate of an attempt that already started"
    IN_FLIGHT = "the same attempt is running elsewhere"
    EARLY = "the attempt is not due yet; the relay publishes it when it is"
    AHEAD = "the message names an attempt the journal never scheduled"
    SKIPPED = "another run holds the concurrency key"


def explain(row: Mapping[str, Any] | None, attempt: int) -> Refusal:
    """Why the guarded claim matched nothing (pure; ``row`` read after the claim)."""
    if row is None:
        return Refusal.NO_ROW
    if is_terminal(row["state"]):
        return Refusal.TERMINAL
    if attempt == row["attempts"] and row["state"] == "running":
        return Refusal.IN_FLIGHT
    if attempt <= row["attempts"]:
        return Refusal.STALE_ATTEMPT
    if attempt > row["attempts"] + 1:
        return Refusal.AHEAD
    return Refusal.EARLY


@dataclass(frozen=True)
class Claimed:
    row: Mapping[str, Any]


def claim(
    engine: Engine,
    spec: RunTable,
    env: Envelope,
    *,
    foreign: journal.NewJob | None,
    worker: str,
) -> Claimed | Refusal:
    """Take the run for ``env.attempt``; ``foreign`` is the row to insert if none exists."""
    now = utcnow()
    with autocommit(engine) as conn:
        row = journal.claim(conn, spec, env.job_id, env.attempt, worker=worker, now=now)
        if row is not None:
            return Claimed(row)
        current = journal.load(conn, spec, env.job_id)
        if current is None and foreign is not None:
            return _claim_foreign(conn, foreign, env, worker=worker, now=now)
    return explain(current, env.attempt)


def _claim_foreign(
    conn: Connection, job: journal.NewJob, env: Envelope, *, worker: str, now: datetime
) -> Claimed | Refusal:
    try:
        row = journal.claim_by_insert(conn, job, env.attempt, worker=worker, now=now)
    except IntegrityError:
        # A foreign key refused the row: the ids name nothing this domain knows.
        raise InvalidMessage("the message names nothing to run on") from None
    if row is not None:
        return Claimed(row)
    holder = journal.active_holder(conn, job.spec, job.concurrency_key)
    journal.record_event(
        conn, job.spec, job.job_id, env.attempt, Transition.SKIP,
        from_state=None, to_state=None, actor=worker, now=now,
        reason=f"concurrency key {job.concurrency_key} held by job {holder}",
    )  # fmt: skip
    return Refusal.SKIPPED
