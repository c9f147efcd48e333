"""The reads of the jobs list filtered by task and of the charts follow an index at a size
where the planner would otherwise scan (issue 37), and so does each hot statement of the
journal and the relay (issue 31: the ones named in jobsapp/lifecycle/journal/hot.py, whose
text tests/golden/ holds), sent by the path that runs it.

A journal of ``PLANTED`` succeeded jobs, half as many failed ones and a tenth queued
(``bench.planting``: the rows jobsapp writes, copied by INSERT ... SELECT over
generate_series) spread over three days, ANALYZEd (committed, so the plans are those
autovacuum would see), plus a few jobs of a rare task. Every statement a page or a hot
path runs is explained with the planner's own costs (no ``enable_seqscan = off``): none
may read a run, outbox or event table with a Seq Scan.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Connection, Engine, create_engine, event, inspect

from bench import planting
from jobsapp.db import make_engine, utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import PendingMessage, outbox_queries
from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.lifecycle.rules.states import Outcome, Transition
from jobsapp.monitor import browse, charts
from jobsapp.shipped import alembic_config
from tests.conftest import migrate, migrated_postgres
from tests.support import golden, tasks
from tests.support.env import SESSION
from tests.support.migrations import RUN_TABLES

pytestmark = pytest.mark.timeout(300)

PLANTED = 30_000
# A day of the charts holds more runs than their sample (charts.SAMPLE), as a busy one does.
SPREAD = timedelta(days=3)
RARE = 5
# The planted tables; the empty ones (the other run tables, workflow_steps) are read
# whole by any plan, as reading an empty table whole costs nothing.
SCANNED = re.compile(r"Seq Scan on (job_runs|outbox|job_events)\b")


@pytest.fixture(scope="module")
def big() -> Iterator[Engine]:
    with migrated_postgres(f"jobsapp_bounded_{SESSION}") as url:
        engine = make_engine(url)
        counts = {
            planting.Kind.SUCCEEDED: PLANTED,
            planting.Kind.FAILED: PLANTED // 2,
            planting.Kind.QUEUED: PLANTED // 10,
        }
        planting.plant(engine, counts, start=utcnow() - SPREAD, spread=SPREAD)
        with engine.begin() as conn:
            journal.enqueue_many(
                conn,
                [tasks.echo.new_job((f"rare-{i}",), {}, None) for i in range(RARE)],
                actor="test",
            )
        with engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE")
            conn.commit()  # ANALYZE in a transaction block is rolled back with it
        yield engine
        engine.dispose()


@contextmanager
def _statements(engine: Engine) -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []

    def record(_c: Any, _cur: Any, statement: str, params: Any, _ctx: Any, _many: bool) -> None:
        seen.append((statement, params))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _scans(engine: Engine, statements: list[tuple[str, Any]]) -> list[str]:
    """The plans of ``statements`` that scan a journal table whole."""
    with engine.connect() as conn:
        return _scans_on(conn, statements, ("SELECT", "WITH"))


def _scans_on(
    conn: Connection, statements: list[tuple[str, Any]], kinds: tuple[str, ...]
) -> list[str]:
    found = []
    for statement, params in statements:
        if not statement.lstrip().upper().startswith(kinds):
            continue
        plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN {statement}", params).scalars())
        if SCANNED.search(plan):
            found.append(f"{statement}\n{params}\n{plan}")
    return found


def test_the_jobs_list_filtered_by_task_reads_the_task_index(big: Engine) -> None:
    wanted = browse.JobFilter(task=tasks.echo.name)
    with _statements(big) as statements:
        page = browse.find_jobs(big, wanted)
    assert page.total == RARE
    scans = _scans(big, statements)
    assert not scans, "\n\n".join(scans)


@pytest.mark.parametrize("window", ["hour", "day"])
def test_the_charts_read_their_window_through_indexes(
    big: Engine, window: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sample as small a part of the planted window as charts.SAMPLE is of a busy
    # journal's day: lookups of a sample that is most of a small table cost more than
    # reading the table, and the planner rightly reads it then.
    monkeypatch.setattr(charts, "SAMPLE", 100)
    with _statements(big) as statements:
        shown = charts.charts(big, window)
    assert sum(b["succeeded"] for b in shown.throughput.buckets) > 0
    scans = _scans(big, statements)
    assert not scans, "\n\n".join(scans)


def _any_job(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.exec_driver_sql("SELECT job_id FROM job_runs LIMIT 1").scalar_one())


@pytest.mark.parametrize("text", ["no such words", "id prefix"])
def test_a_search_reads_an_id_range_and_a_capped_number_of_rows(
    big: Engine, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cap a small part of the planted table, as browse.SEARCH_ROWS is of a busy journal.
    monkeypatch.setattr(browse, "SEARCH_ROWS", 500)
    wanted = _any_job(big)[:13] if text == "id prefix" else text
    with _statements(big) as statements:
        page = browse.find_jobs(big, browse.JobFilter(text=wanted))
    assert page.total == (text == "id prefix")
    scans = _scans(big, statements)
    assert not scans, "\n\n".join(scans)


NEW_INDEXES = {
    *(
        f"ix_{table}_{suffix}"
        for table in RUN_TABLES
        for suffix in ("task_state_updated", "attempted")
    ),
    "ix_job_events_claims",
}


def _new_indexes(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        found = inspect(engine)
        names = {ix["name"] for t in (*RUN_TABLES, "job_events") for ix in found.get_indexes(t)}
        return names & NEW_INDEXES
    finally:
        engine.dispose()


def test_migration_0023_goes_down_and_up_again_on_both_dialects(tmp_path: Path) -> None:
    sqlite = f"sqlite:///{tmp_path}/bounded.db"
    migrate(sqlite)
    with migrated_postgres(f"jobsapp_m0023_{SESSION}") as postgres:
        for url in (sqlite, postgres):
            cfg = alembic_config()
            cfg.set_main_option("sqlalchemy.url", url)
            command.downgrade(cfg, "0022")
            assert _new_indexes(url) == set()
            command.upgrade(cfg, "head")
            assert _new_indexes(url) == NEW_INDEXES


# ------------------------------------------------- the hot statements (journal/hot.py)

WORKER = "w@h:1"
# Past every heartbeat timeout: the reaper's cutoff.
STALE = timedelta(hours=1)


def _queued(conn: Connection) -> PendingMessage:
    result = journal.enqueue(conn, tasks.echo.new_job(("hot",), {}, None), actor="test")
    assert result.message is not None
    return result.message


def _running(conn: Connection, *, ago: timedelta = timedelta(0)) -> journal.Run:
    job_id = _queued(conn).job_id
    run = journal.claim(conn, JOBS, job_id, 1, worker=WORKER, now=utcnow() - ago)
    assert run is not None
    return run


def _claim(conn: Connection) -> Any:
    job_id = _queued(conn).job_id
    return lambda: journal.claim(conn, JOBS, job_id, 1, worker=WORKER)


def _heartbeat(conn: Connection) -> Any:
    run = _running(conn)
    return lambda: journal.heartbeat(conn, JOBS, run.job_id, 1, token=run.claimed_token)


def _succeed(conn: Connection) -> Any:
    run = _running(conn)
    return lambda: journal.succeed(conn, JOBS, run.job_id, 1, token=run.claimed_token, actor=WORKER)


def _fail(conn: Connection) -> Any:
    run = _running(conn)
    return lambda: journal.fail(
        conn,
        JOBS,
        run.job_id,
        1,
        token=run.claimed_token,
        outcome=Outcome.PERMANENT,
        error="ValueError: hot",
        actor=WORKER,
    )


def _requeue(conn: Connection) -> Any:
    run = _running(conn)
    return lambda: journal.requeue(
        conn, JOBS, run, error="hot", transition=Transition.RETRY, actor=WORKER
    )


def _stale_runs(conn: Connection) -> Any:
    _running(conn, ago=STALE)
    return lambda: journal.find_stale(conn, JOBS, cutoff=utcnow() - STALE / 2, limit=10)


def _reap(requeue_them: bool) -> Any:
    def scenario(conn: Connection) -> Any:
        _running(conn, ago=STALE)
        cutoff = utcnow() - STALE / 2
        stale = journal.find_stale(conn, JOBS, cutoff=cutoff, limit=10)
        assert stale
        return lambda: journal.reap(
            conn, JOBS, stale, requeue_them=requeue_them, cutoff=cutoff, reason="r", now=utcnow()
        )

    return scenario


def _due(conn: Connection) -> Any:
    _queued(conn)
    return lambda: outbox_queries.due_messages(
        conn, now=utcnow() + STALE, limit=100, default_queue="celery", lowest_first=False
    )


def _mark_sent(conn: Connection) -> Any:
    sent = _queued(conn)
    accepted = outbox_queries.Accepted(sent.id, 0, timedelta(minutes=5), sent.available_at)
    return lambda: outbox_queries.mark_published(conn, [accepted])


# Each hot statement: the path that sends it, set up in a transaction rolled back after.
PATHS = {
    "claim": _claim,
    "heartbeat": _heartbeat,
    "succeed": _succeed,
    "fail": _fail,
    "requeue": _requeue,
    "stale_runs": _stale_runs,
    "reap_requeue": _reap(True),
    "reap_fail": _reap(False),
    "due_firsts": _due,
    "due_rows": _due,
    "mark_sent": _mark_sent,
}


def test_every_hot_statement_has_a_path_here() -> None:
    assert set(PATHS) == set(golden.HOT)


@pytest.mark.parametrize("name", sorted(PATHS))
def test_a_hot_statement_is_sent_as_named_and_reads_by_an_index(big: Engine, name: str) -> None:
    # A transaction: the statements are sent as compiled (an autocommit connection would
    # EXECUTE them prepared), and the planted journal stays as it was.
    with big.connect() as conn, conn.begin() as trans:
        call = PATHS[name](conn)
        with _statements(big) as statements:
            call()
        sent = [(s, p) for s, p in statements if any(_is(g, s) for g in _kept(name))]
        missing = [g for g in _kept(name) if not any(_is(g, s) for s, _ in statements)]
        assert not missing, f"{name}: not sent as named:\n{missing}\nsent:\n{statements}"
        scans = _scans_on(conn, sent, ("SELECT", "WITH", "UPDATE", "INSERT"))
        trans.rollback()
    assert not scans, "\n\n".join(scans)


def _kept(name: str) -> list[str]:
    return golden.kept(name, "postgresql")


def _is(kept: str, sent: str) -> bool:
    return golden.sent_pattern(kept).fullmatch(sent.strip()) is not None
