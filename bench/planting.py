"""Jobs planted in bulk as jobsapp writes them today, for the benchmarks that need a large
journal (bench.journal_growth, bench.bench_maintenance, bench.bench_growth).

One job of each kind (a chain: its three steps) goes through jobsapp's own statements: the
producer's enqueue, the relay's published mark and, past a worker's claim and its succeed,
fail or retry, the relay's delivered mark. The rows that job left in ``job_runs``,
``outbox``, ``job_events`` and ``workflow_steps`` are then copied by one INSERT ... SELECT
over generate_series per table, each copy with job (and workflow) ids of its own and every
time moved so that it ended (or, queued, was enqueued) at its place in the span; the
template's own rows are deleted. So a planted journal holds what the code writes (since
migration 0015 a success is its run row and its outbox row alone, a failure also its claim
and fail events) and follows it when that changes. Every delivered outbox row keeps the
template's body: nothing reads a delivered row's body.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import Column, Connection, DateTime, Engine, Table, delete, func, select, text

from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import EVENTS, OUTBOX, NewJob, outbox_queries, registry, workflow
from jobsapp.lifecycle.journal.outbox_queries import Accepted
from jobsapp.lifecycle.journal.outbox_rows import PendingMessage
from jobsapp.lifecycle.journal.workflow import STEPS, Step
from jobsapp.lifecycle.rules.states import Outcome, Transition

SPEC = registry.JOBS
TASK = "bench.planted"
PRODUCER, WORKER = "producer", "w@h:1"
PARAMS = {"args": ["bench"], "kwargs": {}}
# The relay's claim check of a published row (``unclaimed_after``), when it also settles a
# finished job's row as delivered.
CHECK_AFTER = timedelta(minutes=5)
CHAIN_STEPS = 3
TABLES = (SPEC.table, OUTBOX, EVENTS, STEPS)


class Kind(StrEnum):
    QUEUED = "queued"  # enqueued, its message published, not claimed yet
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # its one attempt failed for good (a permanent error)
    RETRIED = "retried"  # its first attempt retried, its second succeeded
    CHAIN = "chain"  # a workflow of three steps in a row, each succeeded


def plant(
    engine: Engine,
    counts: Mapping[Kind, int],
    *,
    start: datetime,
    spread: timedelta,
    outbox: bool = True,
) -> None:
    """``counts`` jobs of each kind (chains: workflows of three jobs), their ends (a queued
    job's enqueue) spread evenly over ``start`` .. ``start + spread``; each kind in one
    transaction. ``outbox=False``: without their outbox rows, as retention leaves jobs
    finished more than a day ago."""
    for kind, rows in counts.items():
        templates = _template(engine, kind)
        params: dict[str, Any] = {
            "templates": [str(t) for t in templates],
            "seed": f"{uuid.uuid4()}:",
            "rows": rows,
            "start": start,
            "spread": spread,
        }
        params |= {f"t{n}": str(t) for n, t in enumerate(templates)}
        with engine.begin() as conn:
            for table in (t for t in TABLES if outbox or t is not OUTBOX):
                conn.execute(text(_copies(table, len(templates))), params)
            _forget(conn, templates)


def _template(engine: Engine, kind: Kind) -> list[uuid.UUID]:
    """One job of ``kind`` (a chain: its steps) through the journal's statements."""
    if kind is Kind.CHAIN:
        return _chain(engine)
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
        _published(conn, message)
        if kind is Kind.QUEUED:
            return [job_id]
        if kind is Kind.RETRIED:
            _retried(conn, job_id)
        _worked(conn, job_id, 2 if kind is Kind.RETRIED else 1, failed=kind is Kind.FAILED)
    return [job_id]


def _published(conn: Connection, message: PendingMessage) -> None:
    accepted = Accepted(message.id, 0, CHECK_AFTER, message.available_at)
    outbox_queries.mark_published(conn, [accepted])


def _retried(conn: Connection, job_id: uuid.UUID) -> None:
    """Attempt 1 claimed and retried at once; its next message published."""
    claimed = journal.claim(conn, SPEC, job_id, 1, worker=WORKER)
    assert claimed is not None
    message = journal.requeue(
        conn,
        SPEC,
        claimed,
        error="TimeoutError: planted",
        transition=Transition.RETRY,
        actor=WORKER,
    )
    assert message is not None
    _published(conn, message)


def _worked(conn: Connection, job_id: uuid.UUID, attempt: int, *, failed: bool) -> None:
    """Claimed, succeeded (or failed for good), and the relay's delivered marks."""
    claimed = journal.claim(conn, SPEC, job_id, attempt, worker=WORKER)
    assert claimed is not None
    token = claimed.claimed_token
    started: list[PendingMessage] = []
    if failed:
        assert journal.fail(
            conn,
            SPEC,
            job_id,
            attempt,
            token=token,
            outcome=Outcome.PERMANENT,
            error="ValueError: planted",
            actor=WORKER,
        )
    else:
        assert journal.succeed(
            conn, SPEC, job_id, attempt, token=token, actor=WORKER, started=started
        )
    for message in started:  # a chain's next step, enqueued by this success
        _published(conn, message)
    # The relay settles the rows at their claim check, once the job moved on.
    now = conn.execute(select(func.clock_timestamp())).scalar_one() + CHECK_AFTER
    assert outbox_queries.settle_delivered(conn, SPEC, now=now, limit=attempt) == attempt


def _chain(engine: Engine) -> list[uuid.UUID]:
    """A chain of ``CHAIN_STEPS`` steps written as the canvas compiler writes one, each
    step enqueued by its parent's success; the ids in the order the steps ran."""
    workflow_id, ids = uuid.uuid4(), [uuid.uuid4() for _ in range(CHAIN_STEPS)]
    steps = [
        Step(
            job_id=job_id,
            workflow_id=workflow_id,
            path=str(n),
            module=SPEC.module,
            task_name=TASK,
            args=list(PARAMS["args"]),
            kwargs={},
            immutable=False,
            max_attempts=3,
            trigger=workflow.START if n == 0 else workflow.SUCCESS,
            after=None if n == 0 else str(ids[n - 1]),
            next=[str(ids[n + 1])] if n + 1 < len(ids) else [],
        )
        for n, job_id in enumerate(ids)
    ]
    with engine.begin() as conn:
        workflow.write_steps(conn, steps)
        first = workflow.start(conn, steps[0].row(), [], actor=PRODUCER)
        assert first is not None
        _published(conn, first)
        for job_id in ids:
            _worked(conn, job_id, 1, failed=False)
    return ids


def _copies(table: Table, templates: int) -> str:
    """INSERT ... SELECT of ``rows`` copies of the templates' rows in ``table``: in copy i
    a template id becomes md5(seed || i || ':' || it), as do a workflow's id and the ids a
    step names, and its times move by (its place - the templates' last ``updated_at``),
    which for a finished run is its ``finished_at``."""
    columns = [c for c in table.columns if c.name != "id"]
    # S608: every name comes from jobsapp's table metadata; the values are bound.
    return f"""INSERT INTO {table.name} ({", ".join(f'"{c.name}"' for c in columns)})
        SELECT {", ".join(_copied(c, templates) for c in columns)}
        FROM {table.name} AS src,
             (SELECT max(updated_at) AS t0 FROM {SPEC.table.name}
              WHERE job_id = ANY(CAST(:templates AS uuid[]))) AS tpl,
             (SELECT i, CAST(:start AS timestamptz)
                     + (i::float8 / :rows) * CAST(:spread AS interval) AS at
              FROM generate_series(1, :rows) AS i) AS g
        WHERE src.job_id = ANY(CAST(:templates AS uuid[]))"""  # noqa: S608


def _copied(column: Column[Any], templates: int) -> str:
    if column.name in ("job_id", "workflow_id"):
        return _renamed(f'src."{column.name}"')
    if column.name == "concurrency_key":  # as the task's default key: its own per job
        return f"src.task_name || ':' || {_renamed('src.job_id')}"
    if column.name in ("after", "next"):  # a step's ids of other steps, as JSON text
        named = f'src."{column.name}"::text'
        for n in range(templates):
            named = f"replace({named}, :t{n}, {_renamed(f':t{n}')}::text)"
        return f"CAST({named} AS json)"
    if _is_time(column):
        return f'src."{column.name}" + (g.at - tpl.t0)'
    return f'src."{column.name}"'


def _renamed(template_id: str) -> str:
    return f"md5(:seed || g.i || ':' || {template_id})::uuid"


def _is_time(column: Column[Any]) -> bool:
    kind = column.type
    return isinstance(getattr(kind, "impl_instance", kind), DateTime)


def _forget(conn: Connection, templates: Sequence[uuid.UUID]) -> None:
    for table in (EVENTS, OUTBOX, STEPS, SPEC.table):
        conn.execute(delete(table).where(table.c.job_id.in_(templates)))
