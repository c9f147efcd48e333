"""Read-only views of the journal, as an operator would query it."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, Engine, select

from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.journal.registry import JOBS, RunTable
from jobsapp.lifecycle.journal.tables import JobRun, OutboxMessage


def run_row(engine: Engine, job_id: uuid.UUID) -> Mapping[str, Any]:
    table = JobRun.__table__
    with engine.connect() as conn:
        return conn.execute(select(table).where(table.c.job_id == job_id)).mappings().one()


def run_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return len(conn.execute(select(JobRun.__table__.c.job_id)).all())


def events(engine: Engine, job_id: uuid.UUID) -> list[Mapping[str, Any]]:
    """The job's history as the timeline shows it, whatever its run table: its event rows
    and the enqueue, claim and success its run row carries, in order."""
    with engine.connect() as conn:
        return [e for spec in registry.all_tables() for e in journal.history(conn, spec, job_id)]


def per_job(engine: Engine, transition: str, spec: RunTable = JOBS) -> dict[uuid.UUID, int]:
    """How many times each of ``spec``'s jobs went through ``transition``, in its history
    (jobs that never did are left out)."""
    with engine.connect() as conn:
        ids = conn.execute(select(spec.table.c.job_id)).scalars().all()
        seen = {j: [e["transition"] for e in journal.history(conn, spec, j)] for j in ids}
    return {j: moves.count(transition) for j, moves in seen.items() if transition in moves}


def transitions(engine: Engine, job_id: uuid.UUID) -> list[str]:
    return [e["transition"] for e in events(engine, job_id)]


def outbox_rows(engine: Engine, job_id: uuid.UUID) -> list[Mapping[str, Any]]:
    table = OutboxMessage.__table__
    stmt = select(table).where(table.c.job_id == job_id).order_by(table.c.attempt)
    with engine.connect() as conn:
        return list(conn.execute(stmt).mappings())


def held_by(conn: Connection, spec: RunTable, job_id: uuid.UUID) -> uuid.UUID:
    """The token of the claim that holds the run now: what its worker's writes name."""
    table = spec.table
    token = conn.execute(select(table.c.claim_token).where(table.c.job_id == job_id)).scalar_one()
    assert isinstance(token, uuid.UUID), f"run {job_id} was never claimed"
    return token
