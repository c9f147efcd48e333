"""Scale out: 1, 2, 4 and 8 worker processes behind PgBouncer, on Redis and on RabbitMQ.

Run through the entry point: ``.venv/bin/python -m bench scale [--quick | --smoke]``.
Every process reaches the bench's durable Postgres (fsync on) only through PgBouncer in
transaction pooling mode. Per broker (Redis; RabbitMQ with a quorum queue and publisher
confirms): a fresh database and two beats (one leads, one stands by); then per worker
count, in rising order, workers are added up to W ``celery -A jobsapp worker -c 2``
process groups with distinct host names, and a producer enqueues N no-op
``LifecycleTask`` jobs in batches of 100. Measured: jobs/s from the first of those jobs
done to the last; checked: each of them succeeded in the journal and its body ran
exactly once. Also recorded: client connections PgBouncer held
against the server connections it used, and CPU per job of the workers, Postgres,
PgBouncer and the broker (the producer's is not counted).
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import amqp.exceptions
import kombu
import psycopg2
import redis

from bench import plots
from bench.procstat import tree_cpu
from bench.producer import fast_path_held
from bench.services import ROOT, Instance, Services
from bench.tasks import DONE_KEY

BIN = Path(sys.executable).parent
CELERY = (str(BIN / "celery"), "-A", "jobsapp")
DB_NAME = "jobsapp_bench_scale"
TEMPLATE = f"{DB_NAME}_template"
BROKERS = ("redis", "rabbitmq-quorum")
WORKER_FLAGS = (
    "--pool=prefork",
    "-c",
    "2",
    "--without-gossip",
    "--without-mingle",
    "--without-heartbeat",
    "-l",
    "info",
)
SIZES = {"full": (3000, (1, 2, 4, 8), 3), "quick": (400, (1, 2, 4, 8), 1), "smoke": (20, (1, 2), 1)}


@dataclass(frozen=True)
class Point:
    broker: str
    workers: int
    rate: float  # jobs/s, end to end
    ran: int  # bodies executed (must equal N)
    succeeded: int  # journal rows in 'succeeded' (must equal N)
    clients: int  # PgBouncer client connections to the bench database at the end
    servers: int  # Postgres backends serving that database at the end
    cpu_ms: Mapping[str, float]  # CPU per job by process (workers, postgres, ...)


def _admin(instance: Instance, sql: str) -> None:
    conn = psycopg2.connect(instance.pg_dsn("postgres"))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(sql)
    conn.close()


def _scalar(dsn: str, sql: str) -> int:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True  # PgBouncer's admin console takes no transactions
    with conn.cursor() as cur:
        cur.execute(sql)
        rows = cur.fetchall()
    conn.close()
    if sql.startswith("SHOW"):
        return sum(1 for row in rows if DB_NAME in row)
    return int(rows[0][0])


def assert_quorum(amqp_url: str) -> None:
    """The broker refuses to redeclare Celery's queue as a classic one: it is a quorum queue."""
    with kombu.Connection(amqp_url) as conn:
        try:
            channel: Any = conn.default_channel  # kombu types it as StdChannel
            channel.queue_declare("celery", durable=True, arguments={"x-queue-type": "classic"})
        except amqp.exceptions.PreconditionFailed:
            return
    raise RuntimeError("Celery's queue on RabbitMQ is not a quorum queue")


class Phase:
    """One broker: its database, beats, a growing number of workers, and their logs."""

    def __init__(self, instance: Instance, broker: str, out: Path) -> None:
        self.instance, self.broker, self.workers, self.out = instance, broker, 0, out
        self.counter = redis.Redis.from_url(instance.redis_url(12))
        on_rabbitmq = broker != "redis"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "JOBSAPP_DATABASE_URL": instance.pgbouncer_url(DB_NAME),
            "JOBSAPP_BROKER_URL": instance.amqp_url if on_rabbitmq else instance.redis_url(10),
            "JOBSAPP_STORAGE_URL": f"file://{ROOT}/var/bench/storage",
            "JOBSAPP_REDIS_URL": instance.redis_url(11),
            "JOBSAPP_IMPORTS": "bench.scale_tasks",
            "BENCH_COUNTER_URL": instance.redis_url(12),
            "BENCH_QUORUM": str(int(on_rabbitmq)),
            "JOBSAPP_BEAT_LEASE_SECONDS": "5",
        }
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def fresh_database(self) -> None:
        """A copy of the migrated template: a file copy, not a migration run per phase."""
        _admin(self.instance, f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        _admin(self.instance, f'CREATE DATABASE "{DB_NAME}" TEMPLATE "{TEMPLATE}"')
        for db in (10, 11, 12):
            redis.Redis.from_url(self.instance.redis_url(db)).flushdb()

    def start(self, name: str, argv: list[str]) -> None:
        log = self.out / f"scale-{self.broker}-{name}.log"
        popen = subprocess.Popen(
            argv,
            env=self.env,
            cwd=ROOT,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append((popen, log))

    def start_beats(self) -> None:
        for i in range(2):
            self.start(f"beat{i}", [*CELERY, "beat", "-s", str(self.out / f"beat{i}-schedule")])

    def add_workers(self, total: int) -> None:
        """Start workers until ``total`` run, and wait until every process is ready."""
        for i in range(self.workers, total):
            self.start(f"worker{i}", [*CELERY, "worker", *WORKER_FLAGS, "-n", f"scale{i}@host{i}"])
        self.workers = max(self.workers, total)
        self.wait_ready()

    def wait_ready(self, limit: float = 180) -> None:
        deadline = time.monotonic() + limit
        for popen, log in self.procs:
            while not any(
                m in log.read_text(errors="replace")
                for m in (" ready.", "is the leader", "standing by")
            ):
                if popen.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{log.name} not ready: {log.read_text()[-2000:]}")
                time.sleep(0.1)

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of the workers and of each server on the jobs' path."""
        broker = "redis/redis.pid" if self.broker == "redis" else "rabbitmq/rabbitmq.pid"
        servers = {
            "postgres": "postgres/data/postmaster.pid",
            "pgbouncer": "pgbouncer/pgbouncer.pid",
            "broker": broker,
        }
        seconds = {name: tree_cpu(self.instance.pid(path)) for name, path in servers.items()}
        workers = [popen.pid for popen, log in self.procs if "worker" in log.name]
        return {"workers": sum(tree_cpu(pid) for pid in workers), **seconds}

    def run(self, n: int) -> Point:
        before, done0, succeeded0 = self.cpu(), self.done(), self.succeeded()
        producer = subprocess.Popen(
            [sys.executable, "-m", "bench.producer", "lifecycle-batch", str(n)],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        # From the first job done to the last: the producer's start-up (imports, first
        # connections, ~2 s here) is no part of the workers' throughput.
        first = self.done_at(done0 + 1)
        rate = (n - 1) / max(self.done_at(done0 + n) - first, 1e-6) if n > 1 else 0.0
        _, errors = producer.communicate(timeout=600)
        if producer.returncode != 0:
            raise RuntimeError(f"producer failed: {errors.decode()[-2000:]}")
        fast_path_held(errors.decode(errors="replace"))
        after = self.cpu()
        if self.broker != "redis":
            assert_quorum(self.instance.amqp_url)
        cpu_ms = {name: (after[name] - before[name]) * 1000 / n for name in before}
        ran, succeeded, clients, servers = self.settled(succeeded0 + n)
        return Point(
            self.broker,
            self.workers,
            rate,
            ran - done0,
            succeeded - succeeded0,
            clients,
            servers,
            cpu_ms,
        )

    def done(self) -> int:
        """Bodies run so far in this phase (its earlier worker counts' jobs included)."""
        return int(self.counter.get(DONE_KEY) or 0)

    def succeeded(self) -> int:
        return _scalar(
            self.instance.pg_dsn(DB_NAME), "SELECT count(*) FROM job_runs WHERE state = 'succeeded'"
        )

    def done_at(self, count: int) -> float:
        deadline = time.monotonic() + 120 + count / 5
        while self.done() < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.broker} x{self.workers}: {count} jobs not done in time")
            time.sleep(0.002)
        return time.monotonic()

    def settled(self, succeeded: int) -> tuple[int, int, int, int]:
        """(bodies run, succeeded rows, PgBouncer clients, Postgres backends), once
        ``succeeded`` rows are written (a body counts itself before its run is finished)."""
        deadline = time.monotonic() + 60
        while self.succeeded() < succeeded and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)  # room for a duplicate delivery to show in the counter
        bouncer = f"host=127.0.0.1 port={self.instance.extras_port} user=postgres dbname=pgbouncer"
        backends = f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{DB_NAME}'"  # noqa: S608
        return (
            self.done(),
            self.succeeded(),
            _scalar(bouncer, "SHOW CLIENTS"),
            _scalar(self.instance.pg_dsn("postgres"), backends),
        )

    def stop(self) -> None:
        for popen, _log in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(timeout=30)


def migrated_template(instance: Instance) -> None:
    """The database every phase starts from, migrated once, directly (not via PgBouncer)."""
    _admin(instance, f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
    _admin(instance, f'CREATE DATABASE "{TEMPLATE}"')
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JOBSAPP_DATABASE_URL": instance.pg_url(TEMPLATE),
        "JOBSAPP_BROKER_URL": "memory://",
        "JOBSAPP_STORAGE_URL": f"file://{ROOT}/var/bench/storage",
    }
    subprocess.run(
        [str(BIN / "jobsapp"), "db", "upgrade"], env=env, cwd=ROOT, check=True, capture_output=True
    )


@contextlib.contextmanager
def phase(instance: Instance, broker: str, out: Path) -> Iterator[Phase]:
    current = Phase(instance, broker, out)
    current.fresh_database()
    try:
        current.start_beats()
        yield current
    finally:
        current.stop()


def run(instance: Instance, n: int, counts: tuple[int, ...], rounds: int, out: Path) -> list[Point]:
    points = []
    migrated_template(instance)
    for number in range(1, rounds + 1):
        for broker in BROKERS:
            with phase(instance, broker, out) as current:
                points += [grown(current, workers, n, number) for workers in sorted(counts)]
    return points


def grown(current: Phase, workers: int, n: int, number: int) -> Point:
    """``workers`` running (more started as needed), then N jobs through them."""
    current.add_workers(workers)
    point = current.run(n)
    print(
        f"round {number} {current.broker:<16} workers {workers}  {point.rate:6.0f} jobs/s  "
        f"ran {point.ran}/{n}  succeeded {point.succeeded}/{n}  "
        f"pgbouncer clients {point.clients}  postgres backends {point.servers}  "
        f"load {os.getloadavg()[0]:.1f}  CPU ms/job "
        + " ".join(f"{k} {v:.2f}" for k, v in point.cpu_ms.items()),
        flush=True,
    )
    return point


def medians(points: list[Point]) -> dict[tuple[str, int], float]:
    rates: dict[tuple[str, int], list[float]] = {}
    for p in points:
        rates.setdefault((p.broker, p.workers), []).append(p.rate)
    return {key: statistics.median(values) for key, values in rates.items()}


def ratio_lines(points: list[Point], n: int) -> list[str]:
    rates = medians(points)
    lines = [
        f"scale {broker} {w}/1 workers throughput ratio: {rate / rates[(broker, 1)]:.2f}"
        for (broker, w), rate in rates.items()
        if w != 1
    ]
    once = all(p.ran == n and p.succeeded == n for p in points)
    lines.append(f"scale every job ran once (PgBouncer transaction pooling): {once}")
    return lines


def plot(points: list[Point], path: Path) -> None:
    rates = medians(points)
    with plots.saved(path) as axes:
        for broker in BROKERS:
            counts = sorted(w for b, w in rates if b == broker)
            axes.plot(counts, [rates[(broker, w)] for w in counts], marker="o", label=broker)
        axes.set_xscale("log", base=2)
        axes.set_xlabel("worker processes (-c 2 each), 2 CPU cores")
        axes.set_ylabel("end-to-end jobs/s (median)")
        axes.set_title("jobsapp behind PgBouncer (transaction pooling)")
        axes.legend()


def main(services: Services, size: str, out: Path) -> list[str]:
    n, counts, rounds = SIZES[size]
    with services.extras() as instance:
        points = run(instance, n, counts, rounds, out)
    plot(points, out / "scale.png")
    lines = ratio_lines(points, n)
    print("\n" + "\n".join(lines))
    if not all(p.ran == n and p.succeeded == n for p in points):
        raise RuntimeError(f"a job did not run exactly once: {points}")
    return lines
