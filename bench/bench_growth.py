"""What each read and pass costs as the journal grows (issue 37): ``python -m bench growth``.

For each size (full: 10^5, 10^6 and 10^7 runs; quick: 10^4 and 10^5; smoke: tiny; or
``--sizes``) a fresh database on the bench's Postgres (fsync and synchronous_commit on)
is planted with the mix of a busy journal (bench.planting: 96.5% succeeded, 1% failed,
1% retried then succeeded, 1.5% steps of 3-step chains, finished over the last 7 days,
delivered outbox rows of the last day only, as default retention keeps them; 0.5% queued,
enqueued in the last minutes), VACUUM ANALYZEd, and timed (median of the size's repeat, in
milliseconds): every admin page as a browser's request reaches it (the Flask app
in-process, with the admin token), the two scrapes, ``jobsapp summary``; after the
rollup's rate (below), each maintenance pass with the work a steady journal gives it, and
the hot path (enqueue, claim, succeed of one job, each in its own transaction as the
producer and the worker send them). Every statement a figure sent is EXPLAINed; a Seq
Scan on a run, outbox, event or step table is counted on its line; its plan, and each
figure's slowest statements, are written to ``--out``/growth-plans-ROWS.txt.

The rollup's sustained rate: its cursors are set back over the newest ``BACKLOG``
successes of the journal (and the events among them) and passes run until one counts
nothing; successes counted / seconds. Last, retention's default pass (runs kept 5 days)
with its WAL and the dead rows it leaves, a day of runs deleted against dropped
(bench.journal_growth), and the workflow steps left without a run.

Printed at the end: ``growth <figure> ratio: X`` (largest size over smallest) for each
figure, ``growth rollup successes per second: N`` (at the largest size), ``growth
workflow steps without a run after retention: N`` (summed over sizes) and ``growth Seq
Scans on journal tables at the largest size: N``.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import re
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import Connection, Engine, event, text

from bench import journal_growth
from bench.bench_maintenance import drop_database, fresh_database
from bench.planting import SPEC, TASK, Kind, plant
from bench.services import Services
from jobsapp import cli, db
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import finished_counts, registry, upsert
from jobsapp.lifecycle.journal.outbox_queries import COUNTERS
from jobsapp.lifecycle.journal.row_events import finish_cursor, move_finish_cursor
from jobsapp.maintenance import beat_tasks, reaper, relay, retention
from jobsapp.monitor import rollup
from jobsapp.settings import get_settings

SIZES = {
    "full": ((100_000, 1_000_000, 10_000_000), 3),
    "quick": ((10_000, 100_000), 3),
    "smoke": ((2_000, 6_000), 1),
}
# Of the runs planted: the mix (a chain's share counts its three runs).
MIX = {
    Kind.SUCCEEDED: 0.965,
    Kind.FAILED: 0.01,
    Kind.RETRIED: 0.01,
    Kind.CHAIN: 0.015,
    Kind.QUEUED: 0.005,
}
SPAN = timedelta(days=7)
OUTBOX_KEPT = retention.RetentionConfig.delivered_outbox
# Finished runs end this long before the plant: older than the rollup's settle time.
QUIET = timedelta(minutes=5)
# The rollup's backlog, in successes; the passes it takes are timed.
BACKLOG = {"full": 60_000, "quick": 20_000, "smoke": 1_000}
HOT_JOBS = 50
# The charts' longest window, counted into their series before the pages are read.
CHARTED = timedelta(days=1)
TOKEN = "bench-growth-admin-token-" + uuid.uuid4().hex
SCANNED = re.compile(r"Seq Scan on (job_runs|outbox|job_events|workflow_steps)\b")
# A timed retention pass: one delete of ``batch`` rows per table; runs kept 5 days, so
# two of the 7 planted days are due at every size (what a pass meets in a steady journal
# is a few minutes' worth: a bounded batch, whatever the journal holds). The same work at
# every size: ``_retained`` sizes the batch so the smallest journal has whole workflows
# due for each of its repeats (at most 40: 10^5 has 143 chains past 5 days, 10^4 14).
RETAIN = retention.RetentionConfig(runs=timedelta(days=5), batch=40, max_batches=1)


@dataclass
class Size:
    """One planted journal and what was measured on it."""

    rows: int
    engine: Engine
    app: Celery
    plans: Path
    ms: dict[str, float] = field(default_factory=dict)
    scans: dict[str, list[str]] = field(default_factory=dict)


def _mix(rows: int) -> dict[Kind, int]:
    counts = {kind: round(rows * share) for kind, share in MIX.items()}
    counts[Kind.CHAIN] = max(1, counts[Kind.CHAIN] // 3)
    return counts


def _planted(engine: Engine, rows: int) -> float:
    """The mix over ``SPAN``, as default retention keeps it: delivered outbox rows of the
    last day only."""
    started = time.perf_counter()
    end = datetime.now(UTC) - QUIET
    finished = {kind: n for kind, n in _mix(rows).items() if kind is not Kind.QUEUED}
    older = SPAN - OUTBOX_KEPT
    share = older / SPAN
    plant(
        engine,
        {kind: round(n * share) for kind, n in finished.items()},
        start=end - SPAN,
        spread=older,
        outbox=False,
    )
    plant(
        engine,
        {kind: n - round(n * share) for kind, n in finished.items()},
        start=end - OUTBOX_KEPT,
        spread=OUTBOX_KEPT,
    )
    plant(engine, {Kind.QUEUED: _mix(rows)[Kind.QUEUED]}, start=end, spread=QUIET)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    return time.perf_counter() - started


@contextlib.contextmanager
def _env(url: str, broker: str, out: Path) -> Iterator[None]:
    """The settings a deployment's web and beat read, pointed at this size's database."""
    values = {
        "JOBSAPP_DATABASE_URL": url,
        "JOBSAPP_BROKER_URL": broker,
        "JOBSAPP_STORAGE_URL": f"file://{out / 'growth-storage'}",
        "JOBSAPP_VAR_DIR": str(out / "growth-var"),
        "JOBSAPP_ADMIN_TOKEN": TOKEN,
        # The real cost of a slow read, not the console's 503 at its bound.
        "JOBSAPP_CONSOLE_TIMEOUT": "600",
    }
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    get_settings.cache_clear()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        get_settings.cache_clear()


@dataclass
class Sent:
    statement: str
    params: Any
    ms: float = 0.0


@contextlib.contextmanager
def _statements() -> Iterator[list[Sent]]:
    """Every statement any engine sends meanwhile (the console has an engine of its own),
    with how long it took."""
    seen: list[Sent] = []

    def before(_c: Any, _cur: Any, statement: str, params: Any, _ctx: Any, many: bool) -> None:
        if not many:
            seen.append(Sent(statement, params, time.perf_counter()))

    def after(_c: Any, _cur: Any, statement: str, _p: Any, _ctx: Any, many: bool) -> None:
        if not many and seen and seen[-1].statement is statement:
            seen[-1].ms = (time.perf_counter() - seen[-1].ms) * 1000

    event.listen(Engine, "before_cursor_execute", before)
    event.listen(Engine, "after_cursor_execute", after)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", before)
        event.remove(Engine, "after_cursor_execute", after)


def _slowest(sent: list[Sent], shown: int = 3) -> list[str]:
    return [
        f"    {one.ms:8.1f} ms  {' '.join(one.statement.split())[:240]}"
        for one in sorted(sent, key=lambda one: -one.ms)[:shown]
    ]


def _scans(engine: Engine, statements: list[Sent]) -> list[str]:
    """The plans (EXPLAIN, not run) that read a journal table whole."""
    found, explained = [], set()
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        for statement, params in ((one.statement, one.params) for one in statements):
            head = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else ""
            if head not in ("SELECT", "WITH", "UPDATE", "DELETE") or statement in explained:
                continue
            explained.add(statement)
            try:
                cursor.execute("EXPLAIN " + statement, params)
            except Exception:  # noqa: BLE001 - a statement EXPLAIN cannot take: not a read
                raw.rollback()
                continue
            plan = "\n".join(f"      {row[0]}" for row in cursor.fetchall())
            if SCANNED.search(plan):
                found.append(f"    {' '.join(statement.split())[:200]}\n{plan}")
        raw.rollback()
    finally:
        raw.close()
    return found


def _measure(size: Size, name: str, action: Callable[[], object], repeat: int) -> None:
    """Median ms of ``action``; the statements of its first run EXPLAINed."""
    samples = []
    for n in range(repeat):
        # The garbage planting left is collected here, not in a timed read: a full collection
        # of this process's heap (~40 ms at 10^5) measured the bench, not the read.
        gc.collect()
        with _statements() as sent:
            started = time.perf_counter()
            action()
            samples.append((time.perf_counter() - started) * 1000)
        if n == 0:
            size.scans[name] = _scans(size.engine, sent)
            slowest = _slowest(sent)
    size.ms[name] = statistics.median(samples)
    flagged = f"  SEQ SCANS: {len(size.scans[name])}" if size.scans[name] else ""
    print(f"  {name:<28} {size.ms[name]:10.1f} ms{flagged}", flush=True)
    with size.plans.open("a") as plans:
        plans.write(f"== {name}: {size.ms[name]:.1f} ms; its slowest statements (first run)\n")
        plans.writelines(f"{line}\n" for line in slowest)
        plans.writelines(f"== {name}: Seq Scan\n{plan}\n" for plan in size.scans[name])


def _page(client: Any, path: str) -> Callable[[], None]:
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def get() -> None:
        reply = client.get(path, headers=headers)
        assert reply.status_code == 200, f"{path}: {reply.status_code} {reply.get_data()[:300]!r}"

    return get


def _summary() -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["summary"]) == 0


def _a_chain_step(engine: Engine) -> uuid.UUID:
    with engine.connect() as conn:
        return uuid.UUID(
            str(
                conn.execute(
                    text("SELECT job_id FROM job_runs WHERE workflow_id IS NOT NULL LIMIT 1")
                ).scalar_one()
            )
        )


def _hot_path(engine: Engine) -> None:
    """``HOT_JOBS`` jobs enqueued, claimed and succeeded, one statement's transaction each."""
    for _ in range(HOT_JOBS):
        job_id = uuid.uuid4()
        job = journal.NewJob(
            spec=SPEC,
            job_id=job_id,
            task_name=TASK,
            concurrency_key=f"{TASK}:{job_id}",
            max_attempts=3,
            values={"params": {"args": [], "kwargs": {}}},
        )
        with engine.begin() as conn:
            journal.enqueue(conn, job, actor="producer")
        with db.autocommit(engine) as conn:
            claimed = journal.claim(conn, SPEC, job_id, 1, worker="w@h:1")
        assert claimed is not None
        with db.autocommit(engine) as conn:
            token = claimed.claimed_token
            assert journal.succeed(conn, SPEC, job_id, 1, token=token, actor="w@h:1")


def _reads(size: Size, repeat: int) -> None:
    from jobsapp.web.app import create_app

    client = create_app().test_client()
    step = _a_chain_step(size.engine)
    pages = {
        "overview": "/admin",
        "jobs list": "/admin/jobs",
        "jobs failed": "/admin/jobs?state=failed",
        "task filter": f"/admin/jobs?task={TASK}",
        "search no match": "/admin/jobs?q=no+such+words",
        "search id prefix": f"/admin/jobs?q={str(step)[:13]}",
        "job detail": f"/admin/jobs/{SPEC.module}/{step}",
        "charts hour": "/admin/charts?window=hour",
        "charts day": "/admin/charts?window=day",
        "queues": "/admin/queues",
        "workers": "/admin/workers",
        "scheduled": "/admin/scheduled",
        "metrics": "/metrics",
        "metrics cluster": "/metrics/cluster",
    }
    for name, path in pages.items():
        get = _page(client, path)
        get()  # as an open tab has it: the page's template compiled, its engine connected
        _measure(size, name, get, repeat)
    _measure(size, "summary", _summary, repeat)


def _retained(smallest: int, repeat: int) -> retention.RetentionConfig:
    """``RETAIN`` with a batch of at most the aged chains of the smallest journal over
    its repeats: every timed batch deletes as many rows and whole workflows."""
    aged = _mix(smallest)[Kind.CHAIN] * (SPAN - RETAIN.runs) // SPAN
    return replace(RETAIN, batch=max(1, min(RETAIN.batch, aged // repeat)))


def _passes(size: Size, repeat: int, retain: retention.RetentionConfig) -> None:
    engine, app = size.engine, size.app
    reaper_cfg, relay_cfg = beat_tasks.reaper_config(), beat_tasks.relay_config()
    with engine.begin() as conn:
        # The queued jobs' claim checks not due while the passes are timed: in a live
        # journal workers claim them first; the relay's republishing is bench_maintenance's.
        conn.execute(
            text(
                "UPDATE outbox SET available_at = now() + interval '1 hour' "
                "WHERE published_at IS NOT NULL AND delivered_at IS NULL"
            )
        )
    # As autovacuum leaves a live journal: the update's dead entries in the in-flight index
    # (0.5% of the journal, each below the relay's due bound) would be read by every pass.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE outbox"))
    _measure(size, "reaper", lambda: reaper.run_once(engine, reaper_cfg, app), repeat)
    _measure(size, "relay", lambda: relay.run_once(app, engine, relay_cfg), repeat)
    _measure(size, "retention", lambda: retention.run_once(engine, retain, app), repeat)
    _measure(size, "rollup caught up", lambda: rollup.run_once(engine), repeat)
    _measure(size, f"hot path {HOT_JOBS} jobs", lambda: _hot_path(engine), repeat)


def _cursors(conn: Connection, through: datetime) -> None:
    """Every run table's cursors at ``through`` (its successes' and its finished runs'
    counts: a planted journal was never counted, and its first count of every finished
    run is a one-off, not the rate), the event cursor before the first event after it
    (created where no pass wrote them yet)."""
    for spec in registry.all_tables():
        assert finish_cursor(conn, spec.module) is not None
        move_finish_cursor(conn, spec.module, through)
        assert finished_counts.counting(conn, spec.module) is not None
        finished_counts.counted(conn, spec.module, through)
    before = conn.execute(
        text(
            "SELECT coalesce(min(id) - 1, (SELECT max(id) FROM job_events), 0) "
            "FROM job_events WHERE at > :through"
        ),
        {"through": through},
    ).scalar_one()
    stmt = upsert(conn, COUNTERS).values(name=rollup.CURSOR, value=int(before))
    conn.execute(
        stmt.on_conflict_do_update(index_elements=[COUNTERS.c.name], set_={"value": int(before)})
    )


def _charted(size: Size) -> None:
    """The last day counted by the rollup, as beat keeps it in a live journal: the charts'
    series (``chart_minutes``) the charts pages read."""
    started = time.perf_counter()
    with size.engine.begin() as conn:
        _cursors(conn, datetime.now(UTC) - CHARTED)
    while rollup.run_once(size.engine):
        pass
    print(f"  charts' last day counted in {time.perf_counter() - started:.1f} s", flush=True)


def _rollup_rate(size: Size, backlog: int) -> float:
    """Successes per second the rollup counts, catching up on the newest ``backlog``."""
    with size.engine.begin() as conn:
        since = conn.execute(
            text(
                "SELECT finished_at FROM job_runs WHERE state = 'succeeded' "
                "ORDER BY finished_at DESC OFFSET :n LIMIT 1"
            ),
            {"n": backlog},
        ).scalar() or datetime(2000, 1, 1, tzinfo=UTC)
        due = conn.execute(
            text("SELECT count(*) FROM job_runs WHERE state = 'succeeded' AND finished_at > :s"),
            {"s": since},
        ).scalar_one()
        _cursors(conn, since)
    started, passes = time.perf_counter(), 0
    while rollup.run_once(size.engine):
        passes += 1
    seconds = time.perf_counter() - started
    rate = int(due) / seconds
    print(
        f"  rollup: {due:,} successes (their window's events and finished runs) caught up "
        f"in {passes} "
        f"passes, {seconds:.1f} s: {rate:,.0f} successes/s",
        flush=True,
    )
    return rate


def _retention_drained(size: Size) -> int:
    """Retention's default pass (runs kept 5 days: two planted days due), its WAL and
    the dead rows it leaves; a day of runs deleted against a table of them dropped
    (bench.journal_growth); then the workflow steps left without a run."""
    cfg = retention.RetentionConfig(runs=RETAIN.runs)
    with size.engine.connect() as conn:
        before = journal_growth.wal(conn)
    counts: dict[str, int] = {}
    took = journal_growth.timed(
        lambda: counts.update(retention.run_once(size.engine, cfg, size.app))
    )
    with size.engine.connect() as conn:
        written = journal_growth.wal(conn) - before
        dead = conn.execute(
            text(
                "SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables WHERE relname = 'job_runs'"
            )
        ).one()
        orphans = conn.execute(
            text(
                "SELECT count(*) FROM workflow_steps s WHERE NOT EXISTS "
                "(SELECT 1 FROM job_runs r WHERE r.job_id = s.job_id)"
            )
        ).scalar_one()
    print(
        f"  retention default pass: {took * 1000:.0f} ms, deleted {counts}, "
        f"{written / 2**20:.1f} MiB of WAL ({written / max(sum(counts.values()), 1):.0f} "
        "bytes per row); "
        f"job_runs then holds {dead[0]:,} dead and {dead[1]:,} live rows; "
        f"workflow steps without a run: {orphans}",
        flush=True,
    )
    journal_growth.one_day(size.engine)
    return int(orphans)


def _table_sizes(engine: Engine) -> str:
    with engine.connect() as conn:
        mib = conn.execute(
            text(
                "SELECT sum(pg_total_relation_size(c.oid)) / 2^20 FROM pg_class c "
                "WHERE c.relname IN ('job_runs', 'outbox', 'job_events', 'workflow_steps')"
            )
        ).scalar_one()
    return f"{mib:,.0f} MiB"


def bench_size(
    services: Services,
    rows: int,
    repeat: int,
    backlog: int,
    out: Path,
    retain: retention.RetentionConfig = RETAIN,
) -> tuple[Size, int, float]:
    pg_base = services.durable.pg_url("postgres").rsplit("/", 1)[0]
    name = f"jobsapp_bench_growth_{rows}"
    engine = fresh_database(pg_base, name)
    broker = services.durable.redis_url(8)
    app = Celery("bench-growth", broker=broker, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"])
    try:
        planted = _planted(engine, rows)
        print(
            f"\n== {rows:,} runs planted in {planted:.0f} s ({_table_sizes(engine)} "
            f"with indexes); median of {repeat}",
            flush=True,
        )
        size = Size(rows, engine, app, out / f"growth-plans-{rows}.txt")
        size.plans.unlink(missing_ok=True)
        with _env(f"{pg_base}/{name}", broker, out):
            _charted(size)
            _reads(size, repeat)
            rate = _rollup_rate(size, backlog)
            _passes(size, repeat, retain)
            orphans = _retention_drained(size)
        return size, orphans, rate
    finally:
        app.close()
        engine.dispose()
        for url, cached in list(db._engines.items()):
            if name in url:
                cached.dispose()
        drop_database(pg_base, name)


def main(services: Services, size: str, out: Path, sizes: tuple[int, ...] = ()) -> list[str]:
    planned, repeat = SIZES[size]
    sizes = sizes or planned
    retain = _retained(min(sizes), repeat)
    measured = [bench_size(services, rows, repeat, BACKLOG[size], out, retain) for rows in sizes]
    first, last = measured[0][0], measured[-1][0]
    print("\n== growth (ms, median): figure, " + ", ".join(f"{s.rows:,}" for s, _, _ in measured))
    for name in first.ms:
        print(f"  {name:<28}" + "".join(f"{s.ms[name]:10.1f}" for s, _, _ in measured))
    lines = [f"growth {name} ratio: {last.ms[name] / first.ms[name]:.2f}" for name in first.ms]
    lines.insert(0, f"growth: ratios of {last.rows:,} runs over {first.rows:,}")
    lines.append(f"growth rollup successes per second: {measured[-1][2]:.0f}")
    orphans = sum(o for _, o, _ in measured)
    lines.append(f"growth workflow steps without a run after retention: {orphans}")
    scans = sum(len(found) for found in last.scans.values())
    lines.append(f"growth Seq Scans on journal tables at {last.rows:,} runs: {scans}")
    return lines
