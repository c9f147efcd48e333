"""The hot transitions run as server-side prepared statements on PostgreSQL, and run
unprepared, correctly, when the server connection under them does not know the statement
(what a pooler in transaction mode does)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event, text
from sqlalchemy.exc import DBAPIError

from jobsapp.db import autocommit, make_engine, relaxed_autocommit
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import NewJob
from jobsapp.lifecycle.journal.registry import JOBS
from tests.support.databases import migrated_postgres
from tests.support.env import SESSION
from tests.support.journal_view import run_row, transitions
from tests.support.planted import echo_job, one_job_run


def _prepared(conn: Connection) -> dict[str, int]:
    rows = conn.execute(text("SELECT name, generic_plans FROM pg_prepared_statements"))
    return {name: plans for name, plans in rows}


def test_each_hot_statement_is_prepared_once_and_then_planned_no_more(
    postgres_url: str, pg: Engine
) -> None:
    # A pool of the test's own: connections other tests used hold their statements too.
    engine = make_engine(f"{postgres_url}?application_name=prepared-once")
    with autocommit(engine) as conn:
        done = [one_job_run(conn) for _ in range(8)]
        prepared = _prepared(conn)
    # enqueue, claim, succeed: one statement each, reused by all 8 jobs; from the 6th
    # execution on Postgres runs its generic plan instead of planning again.
    assert len(prepared) == 3, prepared
    assert all(plans >= 1 for plans in prepared.values()), prepared
    for job_id in done:
        assert run_row(pg, job_id)["state"] == "succeeded"
        assert transitions(pg, job_id) == ["enqueue", "claim", "succeed"]


def test_a_bounded_connections_prepared_statement_waits_no_longer_than_its_bound(
    postgres_url: str,
) -> None:
    # The bound (a heartbeat's) rides on the statement the relaxed engine's listener
    # sends; a prepared EXECUTE, run on the DBAPI cursor, must carry it too.
    engine = make_engine(f"{postgres_url}?application_name=prepared-bound")
    job = echo_job()
    with autocommit(engine) as conn:
        assert journal.enqueue_new(conn, job, actor="test") is not None
    holder = engine.connect()
    holder.execute(text("SELECT 1 FROM job_runs WHERE job_id = :j FOR UPDATE"), {"j": job.job_id})
    # Without the bound the claim would wait for this lock: released later, so a failing
    # test ends.
    release = threading.Timer(10, holder.rollback)
    release.start()
    started = time.monotonic()
    try:
        with relaxed_autocommit(engine, bound=0.2) as conn, pytest.raises(DBAPIError) as refused:
            journal.claim(conn, JOBS, job.job_id, 1, worker="w:1")
    finally:
        release.cancel()
        holder.rollback()
        holder.close()
    # lock_not_available or query_canceled: the bound is both timeouts.
    assert getattr(refused.value.orig, "pgcode", None) in {"55P03", "57014"}
    assert time.monotonic() - started < 5
    engine.dispose()


def test_a_prepared_statement_on_a_dropped_connection_fails_as_sqlalchemys_and_the_pool_recovers(
    postgres_url: str, pg: Engine
) -> None:
    # The EXECUTE runs on the DBAPI cursor: its driver error must still be SQLAlchemy's
    # (what the worker treats as transient) and still invalidate the dropped connection.
    engine = make_engine(f"{postgres_url}?application_name=prepared-dropped")
    job = echo_job()
    with autocommit(engine) as conn:
        assert journal.enqueue_new(conn, job, actor="test") is not None
        server = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        with pg.begin() as admin:
            admin.execute(text("SELECT pg_terminate_backend(:p)"), {"p": server})
        with pytest.raises(DBAPIError) as dropped:
            journal.claim(conn, JOBS, job.job_id, 1, worker="w:1")
    assert dropped.value.connection_invalidated
    with autocommit(engine) as conn:
        assert journal.claim(conn, JOBS, job.job_id, 1, worker="w:1") is not None
    engine.dispose()


def _forget_on_server(conn: Connection) -> None:
    """The next statement lands on a server connection that never saw the PREPARE."""
    conn.exec_driver_sql("DEALLOCATE ALL")


def _forget_on_client(conn: Connection) -> None:
    """The next PREPARE lands on a server connection that already has the statement."""
    conn.connection.info.pop("jobsapp_prepared")


@pytest.mark.parametrize("pooled", [_forget_on_server, _forget_on_client])
def test_a_server_connection_that_does_not_match_falls_back_to_unprepared(
    postgres_url: str, pooled: Callable[[Connection], None]
) -> None:
    # A URL of the test's own: the fallback lasts for the engine (and its autocommit
    # variant) it happened on, and must not reach the other tests' engines.
    engine = make_engine(f"{postgres_url}?application_name=fallback-{pooled.__name__}")
    with autocommit(engine) as conn:
        one_job_run(conn)
        pooled(conn)
        job_id = one_job_run(conn)
        conn.exec_driver_sql("DEALLOCATE ALL")
        after = one_job_run(conn)
        assert _prepared(conn) == {}, "the engine prepares no more after a mismatch"
    for done in (job_id, after):
        assert run_row(engine, done)["state"] == "succeeded"
        assert transitions(engine, done) == ["enqueue", "claim", "succeed"]


def test_a_migration_that_changes_a_returned_column_does_not_break_a_running_worker() -> None:
    # A database of the test's own: the ALTER must not reach the other tests' tables.
    with migrated_postgres(f"jobsapp_prepared_alter_{SESSION}") as url:
        engine = make_engine(f"{url}?application_name=prepared-alter")
        with autocommit(engine) as conn:
            one_job_run(conn)  # the worker's connection has prepared its statements
            # A rolling deploy migrates while the worker keeps its pooled connection.
            with engine.begin() as ddl:
                ddl.exec_driver_sql("DROP VIEW job_runs_all")
                ddl.exec_driver_sql("ALTER TABLE job_runs ALTER COLUMN worker TYPE varchar(300)")
            job_id = one_job_run(conn)
        assert run_row(engine, job_id)["state"] == "succeeded"
        engine.dispose()


def test_a_returned_column_whose_type_a_migration_changed_is_read_as_its_new_type() -> None:
    # The row's decoders are learned from the first row the statement returned; a re-prepare
    # after a schema change reads them anew (here float8 -> numeric, which psycopg2 returns
    # as Decimal and SQLAlchemy's Float turns back into a float).
    with migrated_postgres(f"jobsapp_prepared_retype_{SESSION}") as url:
        engine = make_engine(f"{url}?application_name=prepared-retype")
        with autocommit(engine) as conn:
            one_job_run(conn)
            with engine.begin() as ddl:
                ddl.exec_driver_sql("DROP VIEW job_runs_all")
                ddl.exec_driver_sql("ALTER TABLE job_runs ALTER COLUMN time_limit TYPE numeric")
            job = replace(echo_job(), time_limit=2.5)
            assert journal.enqueue_new(conn, job, actor="test") is not None
            run = journal.claim(conn, JOBS, job.job_id, 1, worker="w:1")
        assert run is not None
        assert (run.time_limit, type(run.time_limit)) == (2.5, float)
        engine.dispose()


def _index_reads(conn: Connection) -> dict[str, int]:
    """Index entries read from job_runs so far, this session's counts flushed first."""
    conn.exec_driver_sql("SELECT pg_stat_force_next_flush()")
    conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
    rows = conn.execute(
        text(
            "SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes WHERE relname = 'job_runs'"
        )
    )
    return {name: read for name, read in rows}


@contextmanager
def _never_analyzed(name: str, queued: int) -> Iterator[tuple[Connection, list[NewJob]]]:
    """A new deployment's journal (no statistics: autovacuum's first analyze held off) on a
    worker's connection, whose prepared statements built their generic plans while the
    table was small (8 jobs run); then a backlog of ``queued`` runs arrives."""
    with migrated_postgres(f"jobsapp_prepared_{name}_{SESSION}") as url:
        engine = make_engine(f"{url}?application_name=prepared-{name}")
        with autocommit(engine) as conn:
            conn.exec_driver_sql("ALTER TABLE job_runs SET (autovacuum_enabled = off)")
            for _ in range(8):
                one_job_run(conn)
            backlog = [echo_job() for _ in range(queued)]
            with engine.begin() as producer:
                journal.enqueue_many(producer, backlog, actor="test")
            yield conn, backlog
        engine.dispose()


def test_on_a_table_never_analyzed_each_claim_and_finish_reads_one_row_as_the_table_grows() -> None:
    # A new deployment's table: no statistics until autovacuum's first analyze, which
    # this test holds off. The worker's connection builds its generic plans while the
    # table is small, then a backlog of 2,000 arrives.
    with _never_analyzed("plan", 2000) as (conn, backlog):
        before = _index_reads(conn)
        for job in backlog[:10]:
            run = journal.claim(conn, JOBS, job.job_id, 1, worker="w:1")
            assert run is not None
            assert journal.succeed(conn, JOBS, job.job_id, 1, token=run.claimed_token, actor="w:1")
        after = _index_reads(conn)
        assert all(plans >= 1 for plans in _prepared(conn).values()), _prepared(conn)
    read = {name: after[name] - before.get(name, 0) for name in after}
    # 10 claims and 10 successes: a few entries each through the primary key, never a
    # scan of the 2,000 queued rows (20,000 entries through the state index before).
    assert read["ix_job_runs_state_updated"] == 0, read
    assert 20 <= read["job_runs_pkey"] == sum(read.values()) <= 30, read


def _explained_claim(conn: Connection, claimed: uuid.UUID, explained: uuid.UUID) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE) EXECUTE`` of the claim of ``explained`` on ``conn``, as the worker
    runs it: the prepared statement's EXECUTE and values are those of the claim of
    ``claimed`` through ``journal.claim``, with the other job's id."""
    sent: list[tuple[str, tuple[Any, ...]]] = []

    def keep(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if statement.startswith("EXECUTE"):
            sent.append((statement, tuple(params)))

    event.listen(conn, "before_cursor_execute", keep)
    try:
        assert journal.claim(conn, JOBS, claimed, 1, worker="w:1") is not None
    finally:
        event.remove(conn, "before_cursor_execute", keep)
    assert len(sent) == 1, sent
    statement, params = sent[0]
    mine = tuple(str(explained) if str(v) == str(claimed) else v for v in params)
    assert mine != params, "the claim's values do not name its job"
    plan = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", mine).scalar()
    return dict(plan[0]["Plan"])


def _scans(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The plan's reads of tables (its scans, not the UPDATE that writes)."""
    if "Scan" in node["Node Type"]:
        yield node
    for child in node.get("Plans", []):
        yield from _scans(child)


def test_explain_execute_of_a_claim_on_a_never_analyzed_table_reads_the_run_by_its_key() -> None:
    # The worker's connection builds the claim's generic plan at its sixth EXECUTE, while a
    # new deployment's table is small and has no statistics (autovacuum held off); then a
    # backlog of 5,000 queued runs arrives. The plan of the next claim is the question.
    with _never_analyzed("explain", 5000) as (conn, backlog):
        never = conn.exec_driver_sql(
            "SELECT reltuples < 0 FROM pg_class WHERE relname = 'job_runs'"
        ).scalar()
        plan = _explained_claim(conn, backlog[0].job_id, backlog[2500].job_id)
        generic = _prepared(conn)
    assert never, "the table was analyzed: its plan is not the one in question"
    assert all(plans >= 1 for plans in generic.values()), generic
    scans = [s for s in _scans(plan) if s.get("Relation Name") == "job_runs"]
    # One run read by the primary key; a scan of the state index read all 5,000 queued.
    assert [s.get("Index Name") for s in scans] == ["job_runs_pkey"], scans
    assert all(s.get("Rows Removed by Filter", 0) == 0 for s in scans), scans
    assert all(s["Actual Rows"] == 1 for s in scans), scans
