"""/admin/charts' attempts and percentiles, from the series the rollup keeps
(``chart_minutes``): planted runs of known durations, counted by a rollup pass, read as
the page reads them."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, delete, func, select

from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal.outbox_queries import COUNTERS
from jobsapp.lifecycle.rules.states import Outcome
from jobsapp.monitor import charts, rollup
from tests.support.journal_view import held_by
from tests.support.planted import ERROR, JOBS, queued_job, rolled_up
from tests.support.waiting import eventually, waiting_for_a_lock

# Seconds each planted success ran: one in each of three histogram buckets (<= 0.5, 5, 30).
DURATIONS = (0.3, 4.0, 20.0)


@pytest.fixture
def fresh(db: Engine) -> Engine:
    """The series, the totals and the rollup's cursors start empty with the journal."""
    with db.begin() as conn:
        conn.execute(delete(rollup.SERIES))
        conn.execute(delete(rollup.TOTALS))
        conn.execute(delete(COUNTERS))
    return db


def _ran(db: Engine, seconds: float, ended: datetime, *, fails: bool = False) -> uuid.UUID:
    job_id = queued_job(db, ago=seconds + 1)
    with db.begin() as conn:
        start = ended - timedelta(seconds=seconds)
        assert journal.claim(conn, JOBS, job_id, 1, worker="w1@host", now=start)
        token = held_by(conn, JOBS, job_id)
        if fails:
            done = journal.fail(
                conn,
                JOBS,
                job_id,
                1,
                token=token,
                outcome=Outcome.PERMANENT,
                error=ERROR,
                actor="w1@host",
                now=ended,
            )
        else:
            done = journal.succeed(conn, JOBS, job_id, 1, token=token, actor="w1@host", now=ended)
        assert done
    return job_id


@pytest.mark.parametrize("window", ["hour", "day"])
def test_the_charts_count_and_rank_what_the_rollup_counted(fresh: Engine, window: str) -> None:
    ended = utcnow() - timedelta(minutes=2)
    for seconds in DURATIONS:
        _ran(fresh, seconds, ended)
    _ran(fresh, 1.0, ended, fails=True)
    queued_job(fresh)

    before = charts.charts(fresh, window)
    assert before.counted_through is None
    assert sum(b["succeeded"] for b in before.throughput.buckets) == 0
    assert before.failures == []

    rolled_up(fresh)
    shown = charts.charts(fresh, window)

    totals = {o: sum(b[o] for b in shown.throughput.buckets) for o in charts.OUTCOMES}
    assert totals == {
        "succeeded": 3,
        "retried": 0,
        "snoozed": 0,
        "failed": 1,
        "reaped": 0,
        "cancelled": 0,
    }
    assert sum(b["enqueued"] for b in shown.throughput.buckets) == 5
    # Each percentile is its bucket's upper bound: of 0.3, 1 (the failure), 4 and 20 s,
    # the second is the median, in the <= 1 s bucket.
    assert shown.percentiles[rollup.RUN_DURATION] == {50: 1.0, 95: 30.0, 99: 30.0}
    assert shown.failures == [("ValueError", 1)]
    assert shown.counted_through is not None
    assert shown.counted_through > ended - timedelta(minutes=1)
    (line,) = shown.by_task
    assert (line.task, line.states) == (
        "tests.doomed",
        {"queued": 1, "running": 0, "succeeded": 3, "failed": 1},
    )


def test_minutes_older_than_the_series_keeps_are_dropped_by_the_next_pass(fresh: Engine) -> None:
    _ran(fresh, 1.0, utcnow() - rollup.KEEP_MINUTES - timedelta(minutes=5))
    rolled_up(fresh)  # counts the old minute
    rolled_up(fresh)  # and drops it

    shown = charts.charts(fresh, "day")
    assert sum(b["succeeded"] for b in shown.throughput.buckets) == 0
    with fresh.connect() as conn:
        oldest = conn.execute(select(func.min(rollup.SERIES.c.minute))).scalar_one()
        assert oldest > utcnow() - rollup.KEEP_MINUTES  # the enqueue's minute, just now
        assert rollup.read(conn)  # the all-time totals keep the old success


def test_two_rollup_passes_at_once_count_each_enqueue_once(pg: Engine) -> None:
    """Two beats overlap during a takeover: the second pass waits for the first's enqueue
    cursor instead of counting the same outbox rows again."""
    with pg.begin() as conn:
        conn.execute(delete(rollup.SERIES))
        conn.execute(delete(COUNTERS))
    queued_job(pg)
    first = pg.connect()
    first.begin()
    assert rollup._roll_enqueues(first, utcnow(), rollup.BATCH)[0] >= 1

    def second() -> None:
        with pg.begin() as conn:
            rollup._roll_enqueues(conn, utcnow(), rollup.BATCH)

    other = threading.Thread(target=second)
    other.start()
    eventually(lambda: waiting_for_a_lock(pg) or not other.is_alive())
    first.commit()
    first.close()
    other.join(timeout=20)
    enqueues = select(func.sum(rollup.SERIES.c.value)).where(
        rollup.SERIES.c.metric == rollup.ENQUEUED
    )
    with pg.connect() as conn:
        counted = conn.execute(enqueues).scalar_one()
    with pg.connect() as conn:
        written = conn.execute(
            select(func.count()).select_from(journal.OUTBOX).where(journal.OUTBOX.c.attempt == 1)
        ).scalar_one()
    assert counted == written
