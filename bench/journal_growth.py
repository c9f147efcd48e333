"""Journal growth, measured: ``python -m bench.journal_growth POSTGRES_BASE_URL ROWS``.

POSTGRES_BASE_URL is a server without a database name (``postgresql+psycopg2://postgres@
127.0.0.1:17500``); the database ``jobsapp_bench_growth`` is created there, migrated,
filled and dropped. ROWS successful jobs as jobsapp writes them (bench.planting: since
migration 0015 a success is its ``job_runs`` row and its delivered ``outbox`` row, no
``job_events``), finished over the last 14 days (so half are past the 7-day retention),
plus 1,000 queued jobs with their published messages, enqueued now.

Printed: table and index sizes; jobsapp's own retention pass (``run_once``) cut to one
delete per table, of 1,000 (its default batch) and of 10,000 rows (median of 5, with WAL
bytes per deleted row); one day's worth of runs deleted in one statement against the same
rows in a table of their own dropped (what detaching and dropping a daily partition costs
instead); then, after as many jobs again are planted, one default pass (which deletes
batch after batch until the table is drained, its cap or its time budget).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial

from celery import Celery
from sqlalchemy import Connection, Engine, text

from bench.bench_maintenance import drop_database, fresh_database
from bench.planting import Kind, plant
from jobsapp.maintenance.retention import RetentionConfig, run_once

DB_NAME = "jobsapp_bench_growth"
TABLES = ("job_runs", "job_events", "outbox")
SPAN = timedelta(days=14)

SIZES = """SELECT c.relname, pg_relation_size(c.oid), c.relkind
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i')
      AND (c.relname IN ('job_runs', 'job_events', 'outbox')
           OR c.oid IN (SELECT indexrelid FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
                        WHERE t.relname IN ('job_runs', 'job_events', 'outbox')))
    ORDER BY 2 DESC"""


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def fill(engine: Engine, rows: int) -> None:
    now = datetime.now(UTC)
    for kind, count, start, spread in (
        (Kind.SUCCEEDED, rows, now - SPAN, SPAN),
        (Kind.QUEUED, 1000, now, timedelta(0)),
    ):
        seconds = timed(partial(plant, engine, {kind: count}, start=start, spread=spread))
        print(f"fill: {count:>9} {kind:<9} jobs {seconds:7.1f} s", flush=True)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))


def print_sizes(engine: Engine) -> None:
    with engine.connect() as conn:
        for name, size, kind in conn.execute(text(SIZES)):
            print(f"size: {'table' if kind == 'r' else 'index'} {name:<36} {size / 2**20:8.1f} MiB")


def wal(conn: Connection) -> int:
    # The insert position: the write position stays behind while the WAL fits its buffers.
    sql = "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
    return int(conn.execute(text(sql)).scalar_one())


def retention(engine: Engine, batch: int, repeat: int = 5) -> None:
    """Passes of one delete of ``batch`` rows per table each."""
    app, cfg = Celery("growth"), RetentionConfig(batch=batch, max_batches=1)
    seconds, deleted, wal_bytes = [], 0, 0
    for _ in range(repeat):
        with engine.connect() as conn:
            before = wal(conn)
        started = time.perf_counter()
        counts = run_once(engine, cfg, app)
        seconds.append(time.perf_counter() - started)
        with engine.connect() as conn:
            wal_bytes += wal(conn) - before
        deleted += counts["jobs"] + counts["outbox"] + counts["job_events"]
    print(
        f"retention batch {batch:>6}: {statistics.median(seconds) * 1000:8.0f} ms per pass "
        f"(median of {repeat}), last pass deleted {counts}, "
        f"{wal_bytes / max(deleted, 1):6.0f} WAL bytes per deleted row",
        flush=True,
    )


def drain(engine: Engine) -> None:
    """One pass as beat runs it: batches of 1,000 per table until a short one, the cap or
    the pass's time budget."""
    started = time.perf_counter()
    counts = run_once(engine, RetentionConfig(), Celery("growth"))
    print(
        f"retention default pass: {(time.perf_counter() - started) * 1000:.0f} ms, "
        f"deleted {counts}",
        flush=True,
    )


def one_day(engine: Engine) -> None:
    """Deleting the oldest remaining day against dropping a table holding the same rows."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE day_slice AS SELECT * FROM job_runs WHERE "
                "finished_at < (SELECT min(finished_at) FROM job_runs) + '1 day'"
            )
        )
        conn.execute(text("CREATE INDEX ON day_slice (finished_at)"))
        rows = conn.execute(text("SELECT count(*) FROM day_slice")).scalar_one()
    with engine.begin() as conn:
        before = wal(conn)
        deleted = timed(
            lambda: conn.execute(
                text("DELETE FROM job_runs WHERE job_id IN (SELECT job_id FROM day_slice)")
            )
        )
        delete_wal = wal(conn) - before
    with engine.begin() as conn:
        before = wal(conn)
        dropped = timed(lambda: conn.execute(text("DROP TABLE day_slice")))
        drop_wal = wal(conn) - before
    print(
        f"one day ({rows} runs): DELETE {deleted * 1000:.0f} ms, {delete_wal / 2**20:.1f} MiB "
        f"WAL; DROP of a table holding them {dropped * 1000:.0f} ms, "
        f"{drop_wal / 2**10:.1f} KiB WAL",
        flush=True,
    )


def main(base: str, rows: int) -> None:
    engine = fresh_database(base, DB_NAME)
    try:
        fill(engine, rows)
        print_sizes(engine)
        retention(engine, 1000)
        retention(engine, 10000)
        one_day(engine)
        fill(engine, rows)  # as many again, for a default pass to drain
        drain(engine)
    finally:
        engine.dispose()
        drop_database(base, DB_NAME)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
