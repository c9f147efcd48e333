"""What one maintenance pass costs as the journal grows: reaper and relay on Postgres.

Run through the entry point, on the bench's own Postgres with fsync on:
    .venv/bin/python -m bench maintenance [--quick | --smoke]
(full: 10^4, 10^5 and 10^6 terminal rows, median of 7; quick: 10^4 and 10^5, median of 3).

For each size: a fresh database holding that many terminal runs as jobsapp writes them (1 in
20 failed; bench.planting: a success is its run row and its delivered outbox row, a failure
also its claim and fail events), plus 100 active runs loaded with COPY: 60 running
(20 of them stale before every timed pass) and 40 queued (20 with a crashed producer's
unpublished message, 20 published and not yet due for a check). Timed, median of
``--repeat``: a reaper pass and a relay pass with that work to do, and each pass idle.
Then EXPLAIN ANALYZE of every query the passes ran, with the partial indexes they must
use. The passes publish to Redis database 7, flushed before and after.
"""

from __future__ import annotations

import io
import json
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis
from alembic import command
from celery import Celery
from sqlalchemy import Engine, create_engine, event, text

from bench import plots
from bench.planting import Kind, plant
from bench.services import Services
from jobsapp.db import make_engine
from jobsapp.lifecycle.rules.message import build_body
from jobsapp.maintenance import reaper, relay
from jobsapp.shipped import alembic_config

DB_NAME = "jobsapp_bench_maintenance"
ACTIVE_RUNNING, STALE, QUEUED_DUE, QUEUED_WAITING = 40, 20, 20, 20
STALE_AFTER = timedelta(seconds=30)
UNCLAIMED = timedelta(minutes=5)
CHUNK = 50_000
INDEXES = ("ix_job_runs_running_heartbeat", "ix_outbox_pending", "ix_outbox_inflight")


def _admin(pg_base: str, *statements: str) -> None:
    admin = create_engine(pg_base + "/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        for statement in statements:
            conn.execute(text(statement))
    admin.dispose()


def drop_database(pg_base: str, name: str = DB_NAME) -> None:
    _admin(pg_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def fresh_database(pg_base: str, name: str = DB_NAME) -> Engine:
    _admin(pg_base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"')
    engine = make_engine(f"{pg_base}/{name}")
    # Migrate on our own connection: Alembic's default engine is cached per URL, and the
    # previous size's database of the same name was dropped under its pool.
    with engine.begin() as conn:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return engine


def _ts(moment: datetime) -> str:
    return moment.isoformat()


def _copy(
    engine: Engine, table: str, columns: tuple[str, ...], rows: Iterator[tuple[Any, ...]]
) -> None:
    """COPY ``rows`` in chunks; NULL is \\N, JSON and text carry no tabs or newlines."""
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        sql = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
        while True:
            buf = io.StringIO()
            n = 0
            for row in rows:
                buf.write("\t".join("\\N" if v is None else str(v) for v in row) + "\n")
                n += 1
                if n == CHUNK:
                    break
            if n == 0:
                break
            buf.seek(0)
            cursor.copy_expert(sql, buf)
        raw.commit()
    finally:
        raw.close()


RUN_COLUMNS = (
    "job_id",
    "task_name",
    "concurrency_key",
    "state",
    "outcome",
    "attempts",
    "max_attempts",
    "rescues",
    "heartbeat_at",
    "created_at",
    "started_at",
    "finished_at",
    "updated_at",
    "worker",
    "params",
    "enqueued_by",
    "attempted_at",
)
OUTBOX_COLUMNS = (
    "module",
    "job_id",
    "attempt",
    "task_name",
    "body",
    "created_at",
    "available_at",
    "published_at",
    "publish_count",
    "delivered_at",
)
PARAMS = json.dumps({"args": ["bench"], "kwargs": {}})


def _body(job_id: uuid.UUID, attempt: int, at: datetime) -> str:
    return json.dumps(
        build_body(
            job_id=job_id, module="jobs", attempt=attempt, ids={}, enqueued_at=at, traceparent=None
        )
    )


def load(engine: Engine, terminal: int) -> dict[str, list[uuid.UUID]]:
    """``terminal`` finished jobs and the 100 active ones; returns the active ids by role."""
    now = datetime.now(UTC)
    planted = {Kind.SUCCEEDED: terminal - terminal // 20, Kind.FAILED: terminal // 20}
    plant(engine, planted, start=now - timedelta(days=2), spread=timedelta(days=1))
    roles = {
        name: [uuid.uuid4() for _ in range(n)]
        for name, n in (
            ("running", ACTIVE_RUNNING),
            ("stale", STALE),
            ("due", QUEUED_DUE),
            ("waiting", QUEUED_WAITING),
        )
    }
    active_runs, active_outbox = [], []
    for role, role_ids in roles.items():
        for job_id in role_ids:
            running = role in ("running", "stale")
            at = _ts(now)
            active_runs.append(
                (
                    job_id,
                    "tests.echo",
                    f"tests.echo:{job_id}",
                    "running" if running else "queued",
                    None,
                    int(running),
                    5,
                    0,
                    at if running else None,
                    at,
                    at if running else None,
                    None,
                    at,
                    "w@h:1" if running else None,
                    PARAMS,
                    "producer",
                    at if running else None,
                )
            )
            published = role != "due"
            check = now + UNCLAIMED if published else now - timedelta(minutes=1)
            active_outbox.append(
                (
                    "jobs",
                    job_id,
                    1,
                    "tests.echo",
                    _body(job_id, 1, now),
                    at,
                    _ts(check),
                    at if published else None,
                    int(published),
                    at if running else None,
                )
            )
    _copy(engine, "job_runs", RUN_COLUMNS, iter(active_runs))
    _copy(engine, "outbox", OUTBOX_COLUMNS, iter(active_outbox))
    with engine.begin() as conn:
        conn.execute(text("ANALYZE"))
    return roles


def make_work(engine: Engine, roles: dict[str, list[uuid.UUID]]) -> None:
    """Before a timed pass: the stale runs stopped beating, the due rows are unpublished."""
    old = datetime.now(UTC) - 2 * STALE_AFTER
    with engine.begin() as conn:
        conn.execute(
            text("DELETE FROM outbox WHERE attempt > 1 AND job_id = ANY(:ids)"),
            {"ids": roles["stale"]},
        )
        conn.execute(
            text(
                "UPDATE job_runs SET state = 'running', attempts = 1, rescues = 0, "
                "heartbeat_at = :old, last_error = NULL WHERE job_id = ANY(:ids)"
            ),
            {"old": old, "ids": roles["stale"]},
        )
        conn.execute(
            text(
                "UPDATE outbox SET published_at = NULL, publish_count = 0, "
                "available_at = :old WHERE attempt = 1 AND job_id = ANY(:ids)"
            ),
            {"old": old, "ids": roles["due"]},
        )


def timed(run: Callable[[], object], repeat: int, before: Callable[[], None] | None) -> float:
    samples = []
    for _ in range(repeat):
        if before:
            before()
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


class Recorder:
    """The statements a pass sends, with their parameters, for EXPLAIN afterwards."""

    def __init__(self, engine: Engine) -> None:
        self.seen: dict[str, Any] = {}
        self.engine = engine

    def __enter__(self) -> Recorder:
        event.listen(self.engine, "before_cursor_execute", self._record)
        return self

    def __exit__(self, *_exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._record)

    def _record(self, _conn: Any, _cursor: Any, statement: str, params: Any, *_a: Any) -> None:
        # Inserts of events and outbox rows have no plan worth reading.
        reads = ("job_runs" in statement or "outbox" in statement) and "INSERT" not in statement
        if reads and statement not in self.seen:
            self.seen[statement] = params


def explain(engine: Engine, recorded: dict[str, Any]) -> set[str]:
    """Print each plan (executed, then rolled back); returns the indexes the plans use."""
    used: set[str] = set()
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        for statement, params in recorded.items():
            sql = cursor.mogrify(statement, params).decode()
            cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING ON) " + sql)
            plan = "\n".join(f"    {r[0]}" for r in cursor.fetchall())
            raw.rollback()
            used |= {name for name in INDEXES if name in plan}
            print(f"  -- {' '.join(sql.split())[:160]}...\n{plan}")
    finally:
        raw.close()
    return used


def bench_size(pg_base: str, terminal: int, repeat: int, app: Celery) -> dict[str, float]:
    engine = fresh_database(pg_base)
    started = time.perf_counter()
    roles = load(engine, terminal)
    loaded = time.perf_counter() - started
    reaper_cfg = reaper.ReaperConfig(stale_after=STALE_AFTER, unclaimed_after=UNCLAIMED)
    relay_cfg = relay.RelayConfig(unclaimed_after=UNCLAIMED)

    def work() -> None:
        make_work(engine, roles)

    # Warm the pool and the statement caches outside the timings.
    make_work(engine, roles)
    reaper.run_once(engine, reaper_cfg, app)
    relay.run_once(app, engine, relay_cfg)
    figures = {
        "reaper": timed(lambda: reaper.run_once(engine, reaper_cfg, app), repeat, work),
        "reaper idle": timed(lambda: reaper.run_once(engine, reaper_cfg, app), repeat, None),
        "relay": timed(lambda: relay.run_once(app, engine, relay_cfg), repeat, work),
        "relay idle": timed(lambda: relay.run_once(app, engine, relay_cfg), repeat, None),
    }
    print(
        f"\n== {terminal:,} terminal runs + 100 active (loaded in {loaded:.1f}s); "
        f"median of {repeat}, milliseconds"
    )
    for name, ms in figures.items():
        print(f"  {name:<12} {ms:8.2f}")
    used: set[str] = set()
    passes: tuple[tuple[str, Callable[[], object]], ...] = (
        ("reaper", lambda: reaper.run_once(engine, reaper_cfg, app)),
        ("relay", lambda: relay.run_once(app, engine, relay_cfg)),
    )
    for name, run in passes:
        make_work(engine, roles)
        with Recorder(engine) as rec:
            run()
        make_work(engine, roles)  # EXPLAIN ANALYZE then meets the rows the pass met
        print(f"  plans of the {name} pass's queries (EXPLAIN ANALYZE, rolled back):")
        used |= explain(engine, rec.seen)
    missing = set(INDEXES) - used
    print(f"  indexes used: {sorted(used)}" + (f"; NOT USED: {sorted(missing)}" if missing else ""))
    engine.dispose()
    return figures


SIZES = {
    "full": ((10_000, 100_000, 1_000_000), 7),
    "quick": ((10_000, 100_000), 3),
    "smoke": ((1_000, 2_000), 1),
}


def plot(results: dict[int, dict[str, float]], path: Path) -> None:
    sizes = list(results)
    with plots.saved(path) as ax:
        for name in next(iter(results.values())):
            ax.plot(sizes, [results[size][name] for size in sizes], marker="o", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("terminal runs in the journal")
        ax.set_ylabel("one pass, ms (median)")
        ax.legend()


def main(services: Services, size: str, out: Path) -> list[str]:
    """Runs every size; returns the ratio line: a pass's cost at the largest vs smallest."""
    sizes, repeat = SIZES[size]
    pg_base = services.durable.pg_url("postgres").rsplit("/", 1)[0]
    broker_url = services.durable.redis_url(7)
    broker = redis.Redis.from_url(broker_url)
    broker.flushdb()
    app = Celery("bench-maintenance", broker=broker_url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"])
    results = {size: bench_size(pg_base, size, repeat, app) for size in sizes}
    print("\n== summary (ms, median): size, " + ", ".join(next(iter(results.values()))))
    for terminal, figures in results.items():
        print(f"  {terminal:>9,}  " + "  ".join(f"{ms:8.2f}" for ms in figures.values()))
    broker.flushdb()
    app.close()
    drop_database(pg_base)
    plot(results, out / "maintenance.png")
    small, large = results[sizes[0]], results[sizes[-1]]
    return [
        f"maintenance {name} {sizes[-1]:,}/{sizes[0]:,} rows ratio: {large[name] / small[name]:.2f}"
        for name in small
    ]
