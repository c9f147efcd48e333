"""The reads of the jobs list filtered by task, of the charts, of the admin overview, of
``/metrics/cluster`` and of ``jobsapp summary`` follow an index at a size where the planner
would otherwise scan (issue 37), and so does each hot statement of the journal and the
relay (issue 31: the ones named in jobsapp/lifecycle/journal/hot.py, whose text
tests/golden/ holds), sent by the path that runs it.

A journal of ``PLANTED`` succeeded jobs, half as many failed ones and a tenth queued
(``bench.planting``:
the rows jobsapp writes, copied by INSERT ... SELECT over generate_series) spread over three
days, some of them one-step workflows, ANALYZEd (committed, so the plans are those
autovacuum would see), plus a few jobs of a rare task, counted by rollup passes. Every
statement a page runs is explained with the planner's own costs (no ``enable_seqscan =
off``): none may read a run, outbox, event or step table with a Seq Scan.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, event, inspect

from bench import planting
from jobsapp import cli
from jobsapp.db import make_engine, utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import outbox_queries, registry
from jobsapp.maintenance import reaper, retention
from jobsapp.monitor import browse, charts, rollup
from jobsapp.web.app import create_app
from tests.support import tasks
from tests.support.attachments import environment
from tests.support.databases import migrated_postgres
from tests.support.env import SESSION
from tests.support.migrations import RUN_TABLES, each_dialect_down_and_up
from tests.support.web import TOKEN

pytestmark = pytest.mark.timeout(300)

PLANTED = 30_000
# A day of the charts holds more runs than their sample (charts.SAMPLE), as a busy one does.
SPREAD = timedelta(days=3)
RARE = 5
WORKFLOWS = 1_500
# The planted tables; the empty ones (the other run tables) are read whole by any plan, as
# reading an empty table whole costs nothing.
SCANNED = re.compile(r"Seq Scan on (job_runs|outbox|job_events|workflow_steps)\b")
# Some planted successes as one-step workflows (the steps the workflows line reads).
STEPS_SQL = (
    "UPDATE job_runs SET workflow_id = job_id WHERE job_id IN "
    "(SELECT job_id FROM job_runs WHERE state = 'succeeded' LIMIT %(n)s)",
    "INSERT INTO workflow_steps (job_id, workflow_id, path, module, task_name, args, kwargs, "
    "immutable, max_attempts, trigger, next, errbacks, created_at) "
    "SELECT job_id, workflow_id, '0', 'jobs', task_name, '[]', '{}', false, 1, 'start', "
    "'[]', '[]', created_at FROM job_runs WHERE workflow_id IS NOT NULL",
)


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
            for statement in STEPS_SQL:
                conn.exec_driver_sql(statement, {"n": WORKFLOWS})
        while rollup.run_once(engine, settle=timedelta(0)):
            pass
        with engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE")
            conn.commit()  # ANALYZE in a transaction block is rolled back with it
        yield engine
        engine.dispose()


@pytest.fixture
def configured(big: Engine) -> Iterator[Engine]:
    """The planted journal as the process's database: the web app's and the CLI's."""
    url = big.url.render_as_string(hide_password=False)
    with environment(JOBSAPP_DATABASE_URL=url, JOBSAPP_ADMIN_TOKEN=TOKEN):
        yield big


@contextmanager
def _statements(engine: Engine | type[Engine]) -> Iterator[list[tuple[str, Any]]]:
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


def test_a_task_filter_that_matches_most_of_the_journal_counts_to_its_cap_by_index(
    big: Engine,
) -> None:
    # The planted task is nearly every row: a capped count over an OR of the states was a
    # Seq Scan until the cap (bench growth at 10^6 and 10^7).
    with _statements(big) as statements:
        page = browse.find_jobs(big, browse.JobFilter(task=planting.TASK))
    assert (page.total, page.exact) == (browse.COUNT_CAP, False)
    scans = _scans(big, statements)
    assert not scans, "\n\n".join(scans)


@pytest.mark.parametrize("window", ["hour", "day"])
def test_the_charts_read_their_window_through_indexes(big: Engine, window: str) -> None:
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


def test_the_overview_and_the_cluster_scrape_count_without_reading_the_journal(
    configured: Engine,
) -> None:
    client = create_app().test_client()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with _statements(Engine) as statements:  # every engine: the app resolves its own
        page = client.get("/admin", headers=auth)
        scraped = client.get("/metrics/cluster")
        api = client.get("/v1/admin/jobs?limit=1", headers=auth)
    assert (page.status_code, scraped.status_code, api.status_code) == (200, 200, 200)
    assert api.get_json()["counts"]["jobs"] == {
        "queued": RARE + PLANTED // 10,
        "running": 0,
        "succeeded": PLANTED,
        "failed": PLANTED // 2,
    }
    scans = _scans(configured, statements)
    assert not scans, "\n\n".join(scans)


def test_jobsapp_summary_counts_without_reading_the_journal(
    configured: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    with _statements(Engine) as statements:
        assert cli.main(["summary", "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert f"workflows: 0 running, {WORKFLOWS} succeeded, 0 failed" in out
    assert re.search(rf"jobs\s+succeeded\s+succeeded\s+{PLANTED}\b", out)
    scans = _scans(configured, statements)
    assert not scans, "\n\n".join(scans)


def test_a_search_that_reads_too_long_is_stopped_with_a_hint(
    configured: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bound the planted search cannot meet, as a journal past the search's cap could not.
    monkeypatch.setattr(browse, "SEARCH_TIMEOUT", timedelta(milliseconds=1))
    client = create_app().test_client()
    reply = client.get("/admin/jobs?q=no+such+words", headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == 503
    assert "read for more than 0.001 s and was stopped: narrow it" in reply.get_data(as_text=True)
    listed = client.get("/admin/jobs?state=failed", headers={"Authorization": f"Bearer {TOKEN}"})
    assert listed.status_code == 200  # a list without a search is not bound by it


def test_retention_finds_aged_workflows_through_an_index(big: Engine) -> None:
    """Nothing planted is old enough to go: the pass's reads find that without a scan."""
    long = timedelta(days=3650)
    keep = retention.RetentionConfig(runs=timedelta(days=7), delivered_outbox=long, events=long)
    with _statements(big) as statements:
        gone = retention.run_once(big, keep)
    assert sum(gone.values()) == 0
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
    each_dialect_down_and_up(tmp_path, "m0023", "0022", _new_indexes, NEW_INDEXES)


def _steps_created(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        names = {ix["name"] for ix in inspect(engine).get_indexes("workflow_steps")}
        return names & {"ix_workflow_steps_created"}
    finally:
        engine.dispose()


def test_migration_0027_goes_down_and_up_again_on_both_dialects(tmp_path: Path) -> None:
    each_dialect_down_and_up(
        tmp_path, "m0027", "0026", _steps_created, {"ix_workflow_steps_created"}
    )


def _chart_minutes(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) & {"chart_minutes"}
    finally:
        engine.dispose()


def test_migration_0028_goes_down_and_up_again_on_both_dialects(tmp_path: Path) -> None:
    each_dialect_down_and_up(tmp_path, "m0028", "0027", _chart_minutes, {"chart_minutes"})


def test_the_scheduled_page_reads_the_runs_not_due_through_their_own_index(big: Engine) -> None:
    # Every planted queued run is due: the page reads none of them to find the later ones.
    with _statements(big) as statements:
        page = browse.scheduled(big)
    assert page.total == 0
    with big.connect() as conn:
        plans = [
            "\n".join(conn.exec_driver_sql(f"EXPLAIN {statement}", params).scalars())
            for statement, params in statements
            if "FROM job_runs" in statement
        ]
    assert plans
    assert all("ix_job_runs_scheduled" in plan for plan in plans), "\n\n".join(plans)


def _indexes_ending(suffix: str, url: str) -> set[str]:
    engine = create_engine(url)
    try:
        names = {ix["name"] for t in RUN_TABLES for ix in inspect(engine).get_indexes(t)}
        return {name for name in names if name.endswith(suffix)}
    finally:
        engine.dispose()


def test_migration_0029_goes_down_and_up_again_on_both_dialects(tmp_path: Path) -> None:
    added = {f"ix_{table}_scheduled" for table in RUN_TABLES}
    indexes = partial(_indexes_ending, "_scheduled")
    each_dialect_down_and_up(tmp_path, "m0029", "0028", indexes, added)


def test_the_reapers_expiry_pass_reads_only_the_runs_with_an_expiry(big: Engine) -> None:
    # No planted queued run has an expiry: the pass finds that without reading the backlog.
    with _statements(big) as statements:
        reaper.run_once(big, reaper.ReaperConfig(stale_after=timedelta(hours=1)))
    expiring = [(s, p) for s, p in statements if "FROM job_runs" in s and "expires_at <=" in s]
    assert expiring
    with big.connect() as conn:
        plans = ["\n".join(conn.exec_driver_sql(f"EXPLAIN {s}", p).scalars()) for s, p in expiring]
    assert all("ix_job_runs_expiring" in plan for plan in plans), "\n\n".join(plans)


def test_migration_0030_goes_down_and_up_again_on_both_dialects(tmp_path: Path) -> None:
    added = {f"ix_{table}_expiring" for table in RUN_TABLES}
    indexes = partial(_indexes_ending, "_expiring")
    each_dialect_down_and_up(tmp_path, "m0030", "0029", indexes, added)


def test_the_relays_reads_that_join_a_run_table_are_planned_without_jit(big: Engine) -> None:
    # JIT compiles a plan whose estimate passes jit_above_cost: the unclaimed check's did at
    # 10^7 runs, and compiling it took 18.7 of its 18.9 ms. Here every plan passes it.
    spec = registry.get("jobs")
    reads: list[Callable[[Connection], object]] = [
        lambda conn: outbox_queries.unclaimed_messages(
            conn, spec, now=utcnow(), limit=10, default_queue="celery"
        ),
        lambda conn: outbox_queries.missing_messages(conn, spec, after=None, limit=10),
    ]
    for read in reads:
        with big.begin() as conn:
            conn.exec_driver_sql("SET LOCAL jit_above_cost = 0")
            with _statements(big) as statements:
                read(conn)
            statement, params = statements[-1]
            explained = conn.exec_driver_sql(f"EXPLAIN (ANALYZE) {statement}", params)
            plan = "\n".join(explained.scalars())
            conn.rollback()
        assert "JIT:" not in plan, plan


def test_the_relays_sweep_checks_a_page_of_queued_runs_in_one_read_by_index(big: Engine) -> None:
    # Every planted queued run has its message: the page is checked where it lies, not
    # looked up again by key (at 10^7 runs those lookups walked the key index: 39 ms a page).
    with big.begin() as conn, _statements(big) as statements:
        missing, _cursor = outbox_queries.missing_messages(
            conn, registry.get("jobs"), after=None, limit=500
        )
    assert missing == []
    reads = [(s, p) for s, p in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(reads) == 1, reads
    with big.connect() as conn:
        plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN {reads[0][0]}", reads[0][1]).scalars())
    assert "Seq Scan" not in plan, plan
    assert "job_runs_pkey" not in plan, plan
