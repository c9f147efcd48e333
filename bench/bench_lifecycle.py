"""What the lifecycle costs: bare Celery vs LifecycleTask, no-op jobs, same process and broker.

Needs the services (scripts/services.sh start). Run:
    eval "$(scripts/services.sh env)" && .venv/bin/python -m bench.bench_lifecycle [N] [ROUNDS]
Prints enqueue, drain and end-to-end jobs/s per system and the ratio lifecycle/bare, medians
over interleaved rounds. The worker is a real `celery -A jobsapp worker -c 2` subprocess.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parent.parent
BROKER = os.environ["JOBSAPP_TEST_REDIS_URL"].rsplit("/", 1)[0] + "/5"
COUNTER = BROKER.rsplit("/", 1)[0] + "/6"
PG_ADMIN = os.environ["JOBSAPP_TEST_DATABASE_URL"].rsplit("/", 1)[0] + "/postgres"
DB_URL = PG_ADMIN.rsplit("/", 1)[0] + "/jobsapp_bench"


def bench_env() -> dict[str, str]:
    return {
        **os.environ, "JOBSAPP_DATABASE_URL": DB_URL, "JOBSAPP_BROKER_URL": BROKER,
        "JOBSAPP_REDIS_URL": "", "JOBSAPP_IMPORTS": "bench.tasks", "BENCH_COUNTER_URL": COUNTER,
        "PYTHONPATH": str(ROOT),
    }  # fmt: skip


def fresh_database() -> None:
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text("DROP DATABASE IF EXISTS jobsapp_bench WITH (FORCE)"))
        conn.execute(text("CREATE DATABASE jobsapp_bench"))
    subprocess.run([sys.executable, "-m", "jobsapp.cli", "db", "upgrade"], env=bench_env(),
                   check=True, capture_output=True)  # fmt: skip


def start_worker() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "jobsapp", "worker", "-c", "2", "-l", "warning",
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        env=bench_env(), cwd=ROOT,
    )  # fmt: skip


def wait_for(counter: redis.Redis, key: str, n: int) -> float:
    while int(counter.get(key) or 0) < n:
        time.sleep(0.002)
    return time.perf_counter()


def one_round(
    name: str, send: Callable[[], object], n: int, counter: redis.Redis
) -> tuple[float, float, float]:
    """Enqueue alone (no worker), drain alone (a fresh worker), then both at once."""
    key = f"bench:done:{name}"
    counter.delete(key)
    start = time.perf_counter()
    for _ in range(n):
        send()
    enqueue_rate = n / (time.perf_counter() - start)
    worker = start_worker()
    try:
        first = wait_for(counter, key, 1)
        drain_rate = (n - 1) / (wait_for(counter, key, n) - first)
        counter.delete(key)
        start = time.perf_counter()
        for _ in range(n):
            send()
        e2e_rate = n / (wait_for(counter, key, n) - start)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    return enqueue_rate, drain_rate, e2e_rate


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    os.environ.update(bench_env())
    fresh_database()
    from bench import tasks

    counter = redis.Redis.from_url(COUNTER)
    redis.Redis.from_url(BROKER).flushdb()
    systems = {"bare": tasks.bare.delay, "lifecycle": tasks.with_lifecycle.delay}
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in systems}
    for _ in range(rounds):
        for name, send in systems.items():
            results[name].append(one_round(name, send, n, counter))
    report(results, n, rounds)


def report(results: dict[str, list[tuple[float, float, float]]], n: int, rounds: int) -> None:
    print(f"{n} no-op jobs x {rounds} rounds, worker -c 2, Redis broker, Postgres journal")
    print(f"{'system':<10} {'enqueue/s':>10} {'drain/s':>10} {'e2e/s':>10}")
    medians = {}
    for name, rows in results.items():
        medians[name] = [statistics.median(col) for col in zip(*rows, strict=True)]
        print(f"{name:<10} " + " ".join(f"{v:>10.0f}" for v in medians[name]))
    ratio = [lc / bare for lc, bare in zip(medians["lifecycle"], medians["bare"], strict=True)]
    print("ratio lifecycle/bare: " + " ".join(f"{r:.2f}" for r in ratio)
          + "  (enqueue, drain, end-to-end)")  # fmt: skip


if __name__ == "__main__":
    main()
