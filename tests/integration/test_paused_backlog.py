"""A paused queue's backlog costs a relay tick nothing: the due query does not read it.

5,000 due rows of a paused queue wait in the outbox beside a few of an unpaused one. One
relay tick publishes the unpaused ones, and each statement of its due query (the levels
found by a skip scan, then the rows locked by id), explained again on the same parameters
(EXPLAIN ANALYZE, rolled back), reads at most one batch of outbox rows, never the backlog:
the pause is part of the due query's plan (the levels of ``ix_outbox_pending_level``), not
a filter walked row by row. The tick's other statements look up named jobs (the invariant
sweep's page of queued runs) or published rows (the unclaimed check); a hash join over a
table this small is the planner's cheapest way to do the first, so they are not counted.
The statistics matter: the test's ANALYZE must commit (in a transaction block it rolls
back with it), or the plans are those of whatever autovacuum last saw.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select

from jobsapp.celery_app import app
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.flow import gating
from jobsapp.lifecycle.journal import OUTBOX, NewJob
from jobsapp.maintenance import relay
from tests.support import tasks

pytestmark = pytest.mark.timeout(240)

PAUSED_ROWS = 5_000
OPEN_ROWS = 3
RELAY = relay.RelayConfig(grace=timedelta(0), batch=100)


def _jobs(count: int, queue: str | None) -> list[NewJob]:
    token = uuid.uuid4().hex[:8]
    return [
        replace(tasks.echo.new_job((f"{token}-{i}",), {}, None), queue=queue) for i in range(count)
    ]


@contextmanager
def _statements(engine: Engine) -> Iterator[list[tuple[str, Any]]]:
    """Every statement run on ``engine`` meanwhile, with its parameters."""
    seen: list[tuple[str, Any]] = []

    def record(_c: Any, _cur: Any, statement: str, params: Any, _ctx: Any, _many: bool) -> None:
        seen.append((statement, params))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _outbox_rows_read(plan: Mapping[str, Any]) -> int:
    """Rows the plan's scans of ``outbox`` read: those they passed on and those they
    filtered out, over all their loops."""
    here = 0
    if plan.get("Relation Name") == "outbox":
        read = (
            plan["Actual Rows"]
            + plan.get("Rows Removed by Filter", 0)
            + plan.get("Rows Removed by Index Recheck", 0)
        )
        here = read * plan["Actual Loops"]
    return here + sum(_outbox_rows_read(child) for child in plan.get("Plans", ()))


def _rows_read(engine: Engine, statement: str, params: Any) -> int:
    with engine.connect() as conn:
        explained = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", params)
        raw = explained.scalar_one()
        conn.rollback()  # the explained statement ran: its locks go
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    return _outbox_rows_read(plan)


def _of_the_due_query(statement: str) -> bool:
    """The levels' skip scan, or the due rows it found locked by id."""
    text = " ".join(statement.split())
    return text.upper().startswith("WITH RECURSIVE LEVELS") or (
        text.startswith("SELECT outbox.id,")
        and "WHERE outbox.id IN" in text
        and "FOR UPDATE" in text
    )


def _plan_text(engine: Engine, statement: str, params: Any) -> str:
    """The plan of the statement that read too much, for the failure's message."""
    with engine.connect() as conn:
        lines = conn.exec_driver_sql(f"EXPLAIN (ANALYZE) {statement}", params).scalars()
        text = "\n".join(lines)
        conn.rollback()
    return text


def _pending(engine: Engine, queue: str | None) -> int:
    where = OUTBOX.c.queue.is_(None) if queue is None else OUTBOX.c.queue == queue
    stmt = select(func.count()).where(where, OUTBOX.c.published_at.is_(None))
    with engine.connect() as conn:
        return int(conn.execute(stmt).scalar_one())


def test_a_relay_tick_does_not_read_a_paused_queues_backlog(pg: Engine, redis_clean: None) -> None:
    paused = f"paused-{uuid.uuid4().hex[:8]}"
    assert gating.pause(pg, gating.Kind.QUEUE, paused, actor="operator:test", reason="backlog")
    with pg.begin() as conn:  # written in the producer's transaction: the relay publishes
        journal.enqueue_many(
            conn, _jobs(PAUSED_ROWS, paused) + _jobs(OPEN_ROWS, None), actor="test"
        )
    with pg.connect() as conn:  # as autovacuum does once a backlog has grown: the plans
        conn.exec_driver_sql("ANALYZE outbox, job_runs")  # are those of its statistics
        conn.commit()  # ANALYZE in a transaction block is rolled back with it
    with _statements(pg) as statements:
        counts = relay.run_once(app, pg, RELAY)
    tasks.counter().delete(app.conf.task_default_queue)  # no worker of this test runs them
    assert counts["published"] == OPEN_ROWS
    assert (_pending(pg, None), _pending(pg, paused)) == (0, PAUSED_ROWS)
    reads_outbox = [(s, p) for s, p in statements if _of_the_due_query(s)]
    assert len(reads_outbox) == 2, "the tick ran no due query (its levels, its locked rows)"
    rows_read = [_rows_read(pg, s, p) for s, p in reads_outbox]
    worst = reads_outbox[rows_read.index(max(rows_read))]
    assert max(rows_read) <= RELAY.batch, (rows_read, worst[0], _plan_text(pg, *worst))
