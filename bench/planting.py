"""Jobs planted in bulk as jobsapp writes them today, for the benchmarks that need a large
journal (bench.journal_growth, bench.bench_maintenance).

One job of each kind goes through jobsapp's own statements: the producer's enqueue, the
relay's published mark and, past a worker's claim and its succeed or fail, the relay's
delivered mark. The rows that job left in ``job_runs``, ``outbox`` and ``job_events`` are
then copied by one INSERT ... SELECT over generate_series per table, each copy with a job
id of its own and every time moved so that it ended (or, queued, was enqueued) at its
place in the span; the template's own rows are deleted. So a planted journal holds what
the code writes (since migration 0015 a success is its run row and its outbox row alone,
a failure also its claim and fail events) and follows it when that changes. Every
delivered outbox row keeps the template's body: nothing reads a delivered row's body.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Column, Connection, DateTime, Engine, Table, delete, func, select, text

from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import EVENTS, OUTBOX, NewJob, outbox_queries, registry
from jobsapp.lifecycle.journal.outbox_queries import Accepted
from jobsapp.lifecycle.rules.states import Outcome

SPEC = registry.JOBS
TASK = "bench.planted"
PRODUCER, WORKER = "producer", "w@h:1"
PARAMS = {"args": ["bench"], "kwargs": {}}
# The relay's claim check of a published row (``unclaimed_after``), when it also settles a
# finished job's row as delivered.
CHECK_AFTER = timedelta(minutes=5)


class Kind(StrEnum):
    QUEUED = "queued"  # enqueued, its message published, not claimed yet
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # its one attempt failed for good (a permanent error)


def plant(
    engine: Engine, counts: Mapping[Kind, int], *, start: datetime, spread: timedelta
) -> None:
    """``counts`` jobs of each kind, their ends (a queued job's enqueue) spread evenly over
    ``start`` .. ``start + spread``; each kind in one transaction."""
    for kind, rows in counts.items():
        template = _template(engine, kind)
        params = {
            "template": template,
            "seed": f"{uuid.uuid4()}:",
            "rows": rows,
            "start": start,
            "spread": spread,
        }
        with engine.begin() as conn:
            for table in (SPEC.table, OUTBOX, EVENTS):
                conn.execute(text(_copies(table)), params)
            _forget(conn, template)


def _template(engine: Engine, kind: Kind) -> uuid.UUID:
    """One job of ``kind`` through the journal's statements; returns its id."""
    job_id = uuid.uuid4()
    job = NewJob(
        spec=SPEC,
        job_id=job_id,
        task_name=TASK,
        concurrency_key=f"{TASK}:{job_id}",
        max_attempts=3,
        values={"params": PARAMS},
    )
    with engine.begin() as conn:
        message = journal.enqueue(conn, job, actor=PRODUCER).message
        assert message is not None
        accepted = Accepted(message.id, 0, CHECK_AFTER, message.available_at)
        outbox_queries.mark_published(conn, [accepted])
        if kind is Kind.QUEUED:
            return job_id
        claimed = journal.claim(conn, SPEC, job_id, 1, worker=WORKER)
        assert claimed is not None
        token = claimed.claimed_token
        if kind is Kind.SUCCEEDED:
            assert journal.succeed(conn, SPEC, job_id, 1, token=token, actor=WORKER)
        else:
            assert journal.fail(
                conn,
                SPEC,
                job_id,
                1,
                token=token,
                outcome=Outcome.PERMANENT,
                error="ValueError: planted",
                actor=WORKER,
            )
        # The relay settles the row at its claim check, once the job moved on.
        now = conn.execute(select(func.clock_timestamp())).scalar_one() + CHECK_AFTER
        assert outbox_queries.settle_delivered(conn, SPEC, now=now, limit=1) == 1
    return job_id


def _copies(table: Table) -> str:
    """INSERT ... SELECT of ``rows`` copies of the template's rows in ``table``: copy i
    takes the job id md5(seed || i) and its times moved by (its place - the template's
    ``updated_at``), which for a finished run is its ``finished_at``."""
    columns = [c for c in table.columns if c.name != "id"]
    # S608: every name comes from jobsapp's table metadata; the values are bound.
    return f"""INSERT INTO {table.name} ({", ".join(f'"{c.name}"' for c in columns)})
        SELECT {", ".join(_copied(c) for c in columns)}
        FROM {table.name} AS src,
             (SELECT updated_at AS t0 FROM {SPEC.table.name} WHERE job_id = :template) AS tpl,
             (SELECT md5(:seed || i)::uuid AS job_id, CAST(:start AS timestamptz)
                     + (i::float8 / :rows) * CAST(:spread AS interval) AS at
              FROM generate_series(1, :rows) AS i) AS g
        WHERE src.job_id = :template"""  # noqa: S608


def _copied(column: Column[Any]) -> str:
    if column.name == "job_id":
        return "g.job_id"
    if column.name == "concurrency_key":  # as the task's default key: its own per job
        return "src.task_name || ':' || g.job_id"
    if _is_time(column):
        return f'src."{column.name}" + (g.at - tpl.t0)'
    return f'src."{column.name}"'


def _is_time(column: Column[Any]) -> bool:
    kind = column.type
    return isinstance(getattr(kind, "impl_instance", kind), DateTime)


def _forget(conn: Connection, template: uuid.UUID) -> None:
    for table in (EVENTS, OUTBOX, SPEC.table):
        conn.execute(delete(table).where(table.c.job_id == template))
