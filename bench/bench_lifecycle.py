"""Lifecycle vs peers: N no-op jobs through each system, Postgres with fsync on and off.

Systems: bare Celery (task events off, as Celery ships; and on, as jobsapp ships them for
Flower), a naive lifecycle on Celery (bench/naive.py), jobsapp's ``LifecycleTask`` by
``.delay()`` one by one and by ``enqueue.transaction()`` in batches of 100, and
Procrastinate 3 (its own worker, concurrency 2). Celery workers are ``-c 2`` prefork,
prefetch 1, acks late, on the same Redis broker. Rounds interleave every system on both
Postgres clusters. Per system and round: enqueue alone (no worker), drain alone (a fresh
worker on that backlog, timed from its first finished job), end to end (producer and
worker together; CPU per job of each process and WAL syncs per job are taken here).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import redis

from bench import naive, plots
from bench.procstat import tree_cpu
from bench.services import ROOT, Instance, Services
from bench.tasks import DONE_KEY

CELERY_FLAGS = ("worker", "--pool=prefork", "-c", "2", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "-l", "warning")  # fmt: skip
BIN = Path(sys.executable).parent
BASELINE = "bare"
PROCESSES = ("producer", "worker", "postgres", "redis")


@dataclass(frozen=True)
class System:
    worker: tuple[str, ...]
    env: Mapping[str, str]


SYSTEMS = {
    "bare": System((str(BIN / "celery"), "-A", "bench.bare_app", *CELERY_FLAGS),
                   {"BENCH_TASK_EVENTS": "0"}),
    "bare+events": System((str(BIN / "celery"), "-A", "bench.bare_app", *CELERY_FLAGS),
                          {"BENCH_TASK_EVENTS": "1"}),
    "naive": System((str(BIN / "celery"), "-A", "bench.bare_app", *CELERY_FLAGS),
                    {"BENCH_TASK_EVENTS": "0"}),
    "lifecycle": System((str(BIN / "celery"), "-A", "jobsapp", *CELERY_FLAGS), {}),
    "lifecycle-batch": System((str(BIN / "celery"), "-A", "jobsapp", *CELERY_FLAGS), {}),
    "procrastinate": System((str(BIN / "procrastinate"), "--app=bench.peer_procrastinate.app",
                             "--log-level=warning", "worker", "--concurrency", "2"), {}),
}  # fmt: skip


@dataclass(frozen=True)
class Sample:
    enqueue: float
    drain: float
    e2e: float
    cpu_ms: Mapping[str, float]  # per job, end to end, by process
    wal_syncs: float  # per job, end to end


class Run:
    """One system's producer and worker processes against one Postgres cluster."""

    def __init__(self, system: str, instance: Instance, broker: Instance, out: Path) -> None:
        self.system, self.instance, self.out = system, instance, out
        self.broker = broker
        self.counter = redis.Redis.from_url(broker.redis_url(6))
        dsn = instance.pg_dsn("bench")
        # jobsapp as docker-compose ships it: Redis broker plus the Redis dedup fast path.
        self.env = {
            **os.environ, "PYTHONPATH": str(ROOT), "JOBSAPP_DATABASE_URL": instance.pg_url("bench"),
            "JOBSAPP_BROKER_URL": broker.redis_url(5), "JOBSAPP_REDIS_URL": broker.redis_url(9),
            "JOBSAPP_IMPORTS": "bench.lifecycle_tasks", "BENCH_COUNTER_URL": broker.redis_url(6),
            "BENCH_NAIVE_DSN": dsn, "BENCH_PEER_DSN": dsn, **SYSTEMS[system].env,
        }  # fmt: skip

    def produce(self, n: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "bench.producer", self.system, str(n)],
                                env=self.env, cwd=ROOT, stdout=subprocess.PIPE)  # fmt: skip

    def worker(self) -> subprocess.Popen[bytes]:
        log = (self.out / f"worker-{self.system}-{self.instance.name}.log").open("ab")
        return subprocess.Popen(list(SYSTEMS[self.system].worker), env=self.env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip

    def wait_done(self, n: int, worker: subprocess.Popen[bytes] | None, limit: float) -> float:
        deadline = time.monotonic() + limit
        while int(self.counter.get(DONE_KEY) or 0) < n:
            if worker is not None and worker.poll() is not None:
                raise RuntimeError(f"{self.system} worker exited ({worker.returncode}); "
                                   f"see {self.out}")  # fmt: skip
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.system}: {n} jobs not done in {limit:.0f}s")
            time.sleep(0.002)
        return time.time()


def finished(producer: subprocess.Popen[bytes]) -> dict[str, float]:
    out, _ = producer.communicate(timeout=600)
    if producer.returncode != 0:
        raise RuntimeError(f"producer exited {producer.returncode}")
    result: dict[str, float] = json.loads(out.decode().strip().splitlines()[-1])
    return result


def stop(worker: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker's process group: every job is done and acked by now, and a
    graceful shutdown would only add seconds to each of the many measurements."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)


def wal_syncs(instance: Instance) -> int:
    with psycopg2.connect(instance.pg_dsn("postgres")) as conn, conn.cursor() as cur:
        cur.execute("SELECT wal_sync FROM pg_stat_wal")
        row = cur.fetchone()
    conn.close()
    assert row is not None
    return int(row[0])


def cpu_now(run: Run, worker: subprocess.Popen[bytes]) -> dict[str, float]:
    return {"worker": tree_cpu(worker.pid),
            "postgres": tree_cpu(run.instance.pid("postgres/data/postmaster.pid")),
            "redis": tree_cpu(run.broker.pid("redis/redis.pid"))}  # fmt: skip


def measure(run: Run, n: int) -> Sample:
    limit = 120 + n / 5  # a stuck system fails the run instead of hanging it
    run.counter.delete(DONE_KEY)
    enqueue = n / finished(run.produce(n))["seconds"]
    worker = run.worker()
    try:
        first = run.wait_done(1, worker, limit)
        drain = (n - 1) / max(run.wait_done(n, worker, limit) - first, 1e-6) if n > 1 else 0.0
        run.counter.delete(DONE_KEY)
        cpu0, wal0 = cpu_now(run, worker), wal_syncs(run.instance)
        producer = run.produce(n)
        done = run.wait_done(n, worker, limit)
        sent = finished(producer)
        cpu1, wal1 = cpu_now(run, worker), wal_syncs(run.instance)
    finally:
        stop(worker)
    cpu_ms = {"producer": sent["cpu"] * 1000 / n}
    cpu_ms.update({k: (cpu1[k] - cpu0[k]) * 1000 / n for k in cpu0})
    return Sample(enqueue, drain, n / (done - sent["start"]), cpu_ms, (wal1 - wal0) / n)


def prepare(instance: Instance, env: Mapping[str, str]) -> None:
    """jobsapp's schema (its migrations), the naive tables and Procrastinate's schema."""
    subprocess.run([sys.executable, "-m", "jobsapp.cli", "db", "upgrade"], env=env, cwd=ROOT,
                   check=True, capture_output=True)  # fmt: skip
    naive.create_schema(instance.pg_dsn("bench"))
    subprocess.run([str(BIN / "procrastinate"), "--app=bench.peer_procrastinate.app", "schema",
                    "--apply"], env=env, cwd=ROOT, check=True, capture_output=True)  # fmt: skip


Results = dict[tuple[str, str], list[Sample]]  # (cluster, system) -> one sample per round
CLUSTERS = {"on": "durable", "off": "fast"}


def clusters(results: Results) -> list[str]:
    """The fsync settings measured: both, or "on" alone (a smoke run)."""
    return [fsync for fsync in CLUSTERS if (fsync, BASELINE) in results]


def run(services: Services, n: int, rounds: int, out: Path) -> Results:
    instances = {"on": services.durable}
    if services.fast is not None:
        instances["off"] = services.fast
    for instance in instances.values():
        prepare(instance, Run("lifecycle", instance, services.durable, out).env)
    for db in (5, 9):
        redis.Redis.from_url(services.durable.redis_url(db)).flushdb()
    results: Results = {}
    for number in range(1, rounds + 1):
        for fsync, instance in instances.items():
            for system in SYSTEMS:
                sample = measure(Run(system, instance, services.durable, out), n)
                results.setdefault((fsync, system), []).append(sample)
                print_round(number, fsync, system, sample, results[(fsync, BASELINE)][-1])
    return results


def print_round(number: int, fsync: str, system: str, s: Sample, bare: Sample) -> None:
    print(f"round {number} fsync {fsync:<3} {system:<16} enqueue {s.enqueue:7.0f}/s  "
          f"drain {s.drain:7.0f}/s  e2e {s.e2e:7.0f}/s  e2e/bare {s.e2e / bare.e2e:5.2f}",
          flush=True)  # fmt: skip


def median_ratio(num: Sequence[Sample], den: Sequence[Sample], field: str) -> float:
    """The median over rounds of the per-round ratio (rounds share the machine's drift)."""
    ratios = [float(getattr(a, field) / getattr(b, field)) for a, b in zip(num, den, strict=True)]
    return statistics.median(ratios)


def report(results: Results, n: int, rounds: int) -> list[str]:
    """Prints the tables; returns the ratio lines (the last lines printed)."""
    print(f"\n{n} no-op jobs x {rounds} interleaved rounds; medians. CPU ms per job "
          f"(end to end) by process; WAL syncs per job (pg_stat_wal.wal_sync).")  # fmt: skip
    for fsync in clusters(results):
        print(f"\n-- Postgres fsync {fsync}\n{'system':<16} {'enqueue/s':>9} {'drain/s':>8} "
              f"{'e2e/s':>7}  " + " ".join(f"{p:>8}" for p in PROCESSES) + "  wal/job")
        for system in SYSTEMS:
            rows = results[(fsync, system)]
            rates = [statistics.median(getattr(s, f) for s in rows)
                     for f in ("enqueue", "drain", "e2e")]  # fmt: skip
            cpu = [statistics.median(s.cpu_ms[p] for s in rows) for p in PROCESSES]
            wal = statistics.median(s.wal_syncs for s in rows)
            print(f"{system:<16} {rates[0]:9.0f} {rates[1]:8.0f} {rates[2]:7.0f}  "
                  + " ".join(f"{c:8.2f}" for c in cpu) + f"  {wal:7.2f}")
    lines = ratio_lines(results)
    print("\n" + "\n".join(lines))
    return lines


def ratio_lines(results: Results) -> list[str]:
    lines = []
    measured = clusters(results)
    for fsync in measured:
        bare = results[(fsync, BASELINE)]
        for system in SYSTEMS:
            if system == BASELINE:
                continue
            for field in ("e2e", "enqueue", "drain"):
                ratio = median_ratio(results[(fsync, system)], bare, field)
                lines.append(f"{system}/bare {field} ratio (fsync {fsync}): {ratio:.2f}")
    if measured != list(CLUSTERS):
        return lines
    for system in SYSTEMS:
        ratio = median_ratio(results[("on", system)], results[("off", system)], "e2e")
        lines.append(f"{system} fsync on/off e2e ratio: {ratio:.2f}")
    return lines


def plot(results: Results, path: Path) -> None:
    with plots.saved(path, columns=2, size=(13, 4.5)) as (rates, cpu):
        _plot_rates(results, rates)
        _plot_cpu(results, cpu)


def _plot_rates(results: Results, rates: Any) -> None:
    systems = list(SYSTEMS)
    offsets = {"on": -0.2, "off": 0.2}
    for fsync in clusters(results):
        offset = offsets[fsync]
        values = [statistics.median(s.e2e for s in results[(fsync, name)]) for name in systems]
        rates.bar([i + offset for i in range(len(systems))], values, 0.4, label=f"fsync {fsync}")
    rates.set_xticks(range(len(systems)), systems, rotation=20)
    rates.set_ylabel("end-to-end jobs/s (median)")
    rates.legend()


def _plot_cpu(results: Results, cpu: Any) -> None:
    systems = list(SYSTEMS)
    bottom = [0.0] * len(systems)
    for process in PROCESSES:
        values = [statistics.median(s.cpu_ms[process] for s in results[("on", name)])
                  for name in systems]  # fmt: skip
        cpu.bar(systems, values, bottom=bottom, label=process)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    cpu.set_ylabel("CPU ms per job, fsync on (median)")
    cpu.tick_params(axis="x", rotation=20)
    cpu.legend()


SIZES = {"full": (3000, 4), "quick": (200, 1), "smoke": (10, 1)}


def main(services: Services, size: str, out: Path) -> list[str]:
    n, rounds = SIZES[size]
    results = run(services, n, rounds, out)
    lines = report(results, n, rounds)
    plot(results, out / "lifecycle.png")
    return lines
