"""Transition.ENQUEUE for many jobs at once (the batch path).

A batch writes its jobs and their first messages with one statement on PostgreSQL
(unnested.py: each column one array), elsewhere with one multi-row statement per table
(SQLAlchemy's "insertmanyvalues" renders an executemany as INSERT ... VALUES (...), ...), and
answers each job as the same enqueues one by one, in order, in that transaction would
(enqueue_one.py; a finished job among them is a Transition.RERUN, reopen.py). Called
by lifecycle/producer/enqueue.py's ``Batch`` (the deferred enqueues of one transaction,
flushed together).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Connection, String, any_, bindparam, cast, insert, select
from sqlalchemy.dialects.postgresql import ARRAY

from jobsapp.lifecycle.journal import unnested
from jobsapp.lifecycle.journal._sql import OUTBOX, _require_transaction
from jobsapp.lifecycle.journal.clock import _stamp
from jobsapp.lifecycle.journal.enqueue_one import (
    EnqueueOutcome,
    EnqueueResult,
    enqueue,
    enqueue_existing,
)
from jobsapp.lifecycle.journal.new_run import NewJob, _insert_params, _new_row
from jobsapp.lifecycle.journal.outbox_rows import Outgoing, PendingMessage, outgoing
from jobsapp.lifecycle.journal.plans import _available_at, _insert_plan
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules.states import ACTIVE_STATES, TERMINAL_STATES, State

_OUTBOX_INSERT = insert(OUTBOX).returning(OUTBOX.c.id, OUTBOX.c.job_id)


def enqueue_many(
    conn: Connection, jobs: Sequence[NewJob], *, actor: str, now: datetime | None = None
) -> list[EnqueueResult]:
    """none -> queued for every job, answered in ``jobs``' order as ``enqueue`` would.

    ``conn`` is in a transaction: the rows of every table commit together or not at all.
    """
    _require_transaction(conn, "enqueue_many")
    results: dict[int, EnqueueResult] = {}
    for spec in dict.fromkeys(job.spec for job in jobs):
        positions = [i for i, job in enumerate(jobs) if job.spec is spec]
        answers = _enqueue_into(conn, spec, [jobs[i] for i in positions], actor, now)
        results.update(zip(positions, answers, strict=True))
    return [results[i] for i in range(len(jobs))]


def _enqueue_into(
    conn: Connection, spec: RunTable, jobs: Sequence[NewJob], actor: str, now: datetime | None
) -> list[EnqueueResult]:
    # One job: its one-statement plan. A rerun takes its key at its turn, ahead of any later
    # job of the batch: one by one; so does a limited key's run, into its key's line.
    limited = any(job.key_limit is not None for job in jobs)
    if len(jobs) == 1 or limited or _finished_among(conn, spec, jobs):
        return [enqueue(conn, job, actor=actor, now=now) for job in jobs]
    now = _stamp(conn, now)
    rows = [_new_row(job, now, State.QUEUED, 0, enqueued_by=actor) for job in jobs]
    if conn.dialect.name == "postgresql":
        won, messages = unnested.insert_with_messages(conn, spec, jobs, rows, now)
    else:
        params = [_insert_params(row, now, job) for row, job in zip(rows, jobs, strict=True)]
        result = conn.execute(_many_insert(spec, conn.dialect.name), params)
        inserted = [dict(row) for row in result.mappings()]
        # The run as inserted: what the producer wrote, with the database's clock readings.
        won = {i: {**rows[i], **row} for i, row in _winners(jobs, inserted).items()}
        messages = _first_messages(conn, spec, jobs, won)
    answers = {
        i: EnqueueResult(EnqueueOutcome.ENQUEUED, jobs[i].job_id, message=m)
        for i, m in messages.items()
    }
    answers |= _conflicts(conn, spec, jobs, won, actor, now)
    return [answers[i] for i in range(len(jobs))]


@cache
def _many_insert(spec: RunTable, dialect: str) -> Any:
    """The enqueue's INSERT, also returning the key: a batch tells twins apart by it."""
    plan = _insert_plan(spec, dialect, State.QUEUED)
    return plan.dml.returning(spec.table.c.concurrency_key)


def _finished_among(conn: Connection, spec: RunTable, jobs: Sequence[NewJob]) -> bool:
    table = spec.table
    ids = [job.job_id for job in jobs]
    if conn.dialect.name == "postgresql":
        # The ids as one array literal: an IN list binds (and quotes, in Python) each one.
        literal = bindparam("job_ids", unnested.array_literal(ids), type_=String())
        among = table.c.job_id == any_(cast(literal, ARRAY(table.c.job_id.type)))
    else:
        among = table.c.job_id.in_(ids)
    stmt = select(table.c.job_id).where(among, table.c.state.in_(TERMINAL_STATES))
    return conn.execute(stmt.limit(1)).first() is not None


def _winners(
    jobs: Sequence[NewJob], inserted: Sequence[Mapping[str, Any]]
) -> dict[int, Mapping[str, Any]]:
    """Position -> inserted row: the first job with the row's job_id and key (rows are
    inserted in the statement's order, so a later twin conflicted with it)."""
    first = unnested.first_positions(jobs)
    return {first[(row["job_id"], row["concurrency_key"])]: row for row in inserted}


def _first_messages(
    conn: Connection,
    spec: RunTable,
    jobs: Sequence[NewJob],
    won: Mapping[int, Mapping[str, Any]],
) -> dict[int, PendingMessage]:
    """The first message of every inserted run, stamped with the run's own clock reading,
    in one statement (the row carries the enqueue: ``enqueued_by``, no event row)."""
    if not won:
        return {}
    outgoing_by_position: dict[int, Outgoing] = {}
    for i, row in won.items():
        at = row["updated_at"]
        outgoing_by_position[i] = outgoing(
            spec,
            row,
            attempt=1,
            now=at,
            available_at=_available_at(row),
            traceparent=jobs[i].traceparent,
            lineage=jobs[i].lineage,
        )
    values = [out.values(spec.module) for out in outgoing_by_position.values()]
    by_job = {job_id: int(outbox_id) for outbox_id, job_id in conn.execute(_OUTBOX_INSERT, values)}
    return {
        i: out.pending(by_job[out.job_id], _available_at(won[i]))
        for i, out in outgoing_by_position.items()
    }


def _conflicts(
    conn: Connection,
    spec: RunTable,
    jobs: Sequence[NewJob],
    won: Mapping[int, Mapping[str, Any]],
    actor: str,
    now: datetime | None,
) -> dict[int, EnqueueResult]:
    """The answer for each job whose insert conflicted: DUPLICATE when its job_id was
    taken at its turn, else SKIPPED with the key's holder."""
    lost = [i for i in range(len(jobs)) if i not in won]
    if not lost:
        return {}
    inserted_at = {jobs[i].job_id: i for i in sorted(won, reverse=True)}
    states = _states(conn, spec, [jobs[i].job_id for i in lost])
    holders = _holders(conn, spec, [jobs[i].concurrency_key for i in lost])
    answers: dict[int, EnqueueResult] = {}
    for i in lost:
        job = jobs[i]
        kind = conflict_outcome(i, inserted_at.get(job.job_id), states.get(job.job_id))
        if kind is None:
            answers[i] = enqueue_existing(conn, job, actor=actor, now=now)
        else:
            holder = holders.get(job.concurrency_key) if kind is EnqueueOutcome.SKIPPED else None
            answers[i] = EnqueueResult(kind, job.job_id, holder=holder)
    return answers


def conflict_outcome(position: int, turn: int | None, state: str | None) -> EnqueueOutcome | None:
    """What the conflicted insert of a batch's job at ``position`` means.

    ``turn`` is where the batch itself inserted that job_id (None: it did not), ``state``
    the row's state otherwise (None: no row). The job_id existed at the job's turn:
    DUPLICATE; it did not, so only the key was taken: SKIPPED. None for a finished row
    (inserted and finished by others since the batch looked): a rerun, which
    ``enqueue_existing`` decides.
    """
    if turn is not None:
        return EnqueueOutcome.DUPLICATE if turn < position else EnqueueOutcome.SKIPPED
    if state is None:
        return EnqueueOutcome.SKIPPED
    return EnqueueOutcome.DUPLICATE if state in ACTIVE_STATES else None


def _states(conn: Connection, spec: RunTable, job_ids: Sequence[uuid.UUID]) -> dict[Any, str]:
    table = spec.table
    stmt = select(table.c.job_id, table.c.state).where(table.c.job_id.in_(job_ids))
    return {key: value for key, value in conn.execute(stmt)}


def _holders(conn: Connection, spec: RunTable, keys: Sequence[str]) -> dict[str, Any]:
    """The active run holding each of ``keys`` (at most one each: the partial index)."""
    table = spec.table
    stmt = select(table.c.concurrency_key, table.c.job_id).where(
        table.c.concurrency_key.in_(keys), table.c.state.in_(ACTIVE_STATES)
    )
    return {key: value for key, value in conn.execute(stmt)}
