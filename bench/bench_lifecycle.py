"""Lifecycle vs peers: N no-op jobs through each system, Postgres with fsync on and off.

Systems: bare Celery, a naive lifecycle on Celery (bench/naive.py), jobsapp's
``LifecycleTask`` by ``.delay()`` one by one (also with ``JOBSAPP_FINISH_FLUSH=no-wait``:
``lifecycle-nowait``) and by ``enqueue.transaction()`` in batches of 100, and Procrastinate
3 (its own worker, concurrency 2). Bare Celery and jobsapp run with Celery's task events off
and on (worker events and the producer's task-sent event alike), and as jobsapp's
celeryconfig.py ships them, so every comparison has the same event settings on both sides.
Celery workers are ``-c 2`` prefork, prefetch 1, acks late, on the same Redis broker. Rounds
interleave every system on both Postgres clusters. Per system and round: enqueue alone (no
worker), drain alone (a fresh worker on that backlog, timed from its first finished job),
end to end (producer and worker together; CPU per job of each process and WAL syncs per job
are taken here), and the journal rows written per job (counted in its tables once every job
of the measurement finished).
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import select
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import redis
from psycopg2 import sql

from bench import cost, naive, plots
from bench.procstat import tree_cpu
from bench.producer import fast_path_held
from bench.services import ROOT, Instance, Services
from bench.tasks import DONE_KEY
from jobsapp.shipped import CELERYCONFIG

CELERY_FLAGS = (
    "worker",
    "--pool=prefork",
    "-c",
    "2",
    "--without-gossip",
    "--without-mingle",
    "--without-heartbeat",
    "-l",
    "warning",
)
BIN = Path(sys.executable).parent
# Producers and workers run here: jobsapp finds the bench's deployment celeryconfig.py.
DEPLOYMENT = ROOT / "bench" / "deployment"
BASELINE = "bare"
PROCESSES = ("producer", "worker", "postgres", "redis")
FIELDS = ("enqueue", "drain", "e2e")


@dataclass(frozen=True)
class Events:
    """Celery's task events as one run takes them."""

    worker: bool  # worker_send_task_events (Flower turns them on while it watches)
    sent: bool  # task_send_sent_event (the producer's task-sent event)

    @property
    def label(self) -> str:
        if self.worker == self.sent:
            return "on" if self.worker else "off"
        return f"worker {'on' if self.worker else 'off'}, sent {'on' if self.sent else 'off'}"

    def env(self) -> dict[str, str]:
        return {
            "BENCH_WORKER_EVENTS": str(int(self.worker)),
            "BENCH_SENT_EVENTS": str(int(self.sent)),
        }


OFF, ON = Events(worker=False, sent=False), Events(worker=True, sent=True)


def shipped_events(config: Path = CELERYCONFIG) -> Events:
    """The events jobsapp's celeryconfig.py ships (Celery's default, off, where it is silent)."""
    settings = runpy.run_path(str(config))
    return Events(
        worker=bool(settings.get("worker_send_task_events", False)),
        sent=bool(settings.get("task_send_sent_event", False)),
    )


@dataclass(frozen=True)
class Journal:
    """Where a system keeps its jobs: the tables whose rows count, and the query that says
    how many jobs are not finished yet (a body counts itself done before its finish)."""

    tables: tuple[str, ...]
    unfinished: str


@dataclass(frozen=True)
class System:
    sender: str  # bench.producer's name for how it enqueues
    worker: tuple[str, ...]
    events: Events | None = None  # None: not Celery
    journal: Journal | None = None  # None: keeps none
    env: Mapping[str, str] | None = None  # jobsapp settings of its own


def system_name(kind: str, events: Events) -> str:
    return kind if events == OFF else f"{kind}+events" if events == ON else f"{kind}+shipped"


BARE_WORKER = (str(BIN / "celery"), "-A", "bench.bare_app", *CELERY_FLAGS)
JOBSAPP_WORKER = (str(BIN / "celery"), "-A", "jobsapp", *CELERY_FLAGS)
LIFECYCLE_JOURNAL = Journal(
    ("job_runs", "outbox", "job_events"), "SELECT count(*) FROM job_runs WHERE state <> 'succeeded'"
)
NAIVE_JOURNAL = Journal(
    ("naive_runs", "naive_outbox"), "SELECT count(*) FROM naive_runs WHERE state <> 'succeeded'"
)
PROCRASTINATE_JOURNAL = Journal(
    ("procrastinate_jobs", "procrastinate_events"),
    "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'",
)


def systems(shipped: Events) -> dict[str, System]:
    """Bare Celery and jobsapp with events off, on and as shipped (a third run only where
    that is neither); the naive lifecycle as Celery ships (events off); the batch path as
    shipped."""
    variants = list(dict.fromkeys((OFF, ON, shipped)))
    found = {system_name("bare", e): System("bare", BARE_WORKER, e) for e in variants}
    found["naive"] = System("naive", BARE_WORKER, OFF, NAIVE_JOURNAL)
    found |= {
        system_name("lifecycle", e): System("lifecycle", JOBSAPP_WORKER, e, LIFECYCLE_JOURNAL)
        for e in variants
    }
    found["lifecycle-batch"] = System("lifecycle-batch", JOBSAPP_WORKER, shipped, LIFECYCLE_JOURNAL)
    found["lifecycle-nowait"] = System(
        "lifecycle", JOBSAPP_WORKER, shipped, LIFECYCLE_JOURNAL, {"JOBSAPP_FINISH_FLUSH": "no-wait"}
    )
    found["procrastinate"] = System(
        "procrastinate",
        (
            str(BIN / "procrastinate"),
            "--app=bench.peer_procrastinate.app",
            "--log-level=warning",
            "worker",
            "--concurrency",
            "2",
        ),
        journal=PROCRASTINATE_JOURNAL,
    )
    return found


@dataclass(frozen=True)
class Comparison:
    """jobsapp against a peer, the same event settings on both sides."""

    label: str  # the ratio line's name, e.g. "lifecycle/naive"
    qualifier: str  # after "fsync on" in the ratio line
    jobsapp: str
    peer: str
    fields: tuple[str, ...]  # those that get a closing ratio line


def comparisons(shipped: Events) -> list[Comparison]:
    """The first is events as shipped on both sides; naive and Procrastinate are compared
    with jobsapp's events off, as Celery ships them (Procrastinate sends none)."""
    as_shipped = system_name("lifecycle", shipped), system_name("bare", shipped)
    return [
        Comparison("lifecycle/bare", "", *as_shipped, ("e2e", "enqueue", "drain")),
        Comparison("lifecycle/bare", ", events off", "lifecycle", "bare", ("e2e",)),
        Comparison("lifecycle/bare", ", events on", "lifecycle+events", "bare+events", ("e2e",)),
        Comparison("lifecycle/naive", "", "lifecycle", "naive", ("e2e",)),
        Comparison("lifecycle/procrastinate", "", "lifecycle", "procrastinate", ("e2e",)),
        Comparison(
            "lifecycle-batch/bare", "", "lifecycle-batch", as_shipped[1], ("e2e", "enqueue")
        ),
        Comparison("lifecycle-nowait/lifecycle", "", "lifecycle-nowait", as_shipped[0], ("e2e",)),
        Comparison("bare+events/bare", "", "bare+events", "bare", ("e2e",)),
    ]


SHIPPED = shipped_events()
SYSTEMS = systems(SHIPPED)
COMPARISONS = comparisons(SHIPPED)


@dataclass(frozen=True)
class Sample:
    enqueue: float
    drain: float
    e2e: float
    cpu_ms: Mapping[str, float]  # per job, end to end, by process
    wal_syncs: float  # per job, end to end
    rows: Mapping[str, float]  # journal rows written per job, by table

    @property
    def rows_per_job(self) -> float:
        return sum(self.rows.values())


class Producer:
    """One producer process for a measurement's phases: ``send(n)`` starts n jobs,
    ``result()`` waits for that batch's figures."""

    def __init__(self, run: Run) -> None:
        # Its log is read at its end: a publish refused or left to the relay fails the run.
        self.log = run.out / f"producer-{run.system}-{run.instance.name}.log"
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench.producer", SYSTEMS[run.system].sender],
                env=run.env,
                cwd=DEPLOYMENT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )

    def send(self, n: int) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{n}\n")
        self.process.stdin.flush()

    def result(self, limit: float = 600) -> dict[str, float]:
        out = self.process.stdout
        assert out is not None
        # One short line per send, written at once: readable means the line is whole.
        if not select.select([out], [], [], limit)[0]:
            raise RuntimeError(f"producer gave no figures in {limit:.0f}s")
        line = out.readline()
        if not line:
            raise RuntimeError(f"producer exited {self.process.wait()}")
        result: dict[str, float] = json.loads(line)
        return result

    def close(self) -> None:
        """Ends it after its last batch; returns once it exited (its exit flushes its last
        publish marks, a part of the jobs' cost)."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        if self.process.wait(timeout=60) != 0:
            raise RuntimeError(f"producer exited {self.process.returncode}; see {self.log}")
        fast_path_held(self.log.read_text(errors="replace"))

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class Run:
    """One system's producer and worker processes against one Postgres cluster."""

    def __init__(self, system: str, instance: Instance, broker: Instance, out: Path) -> None:
        self.system, self.instance, self.out = system, instance, out
        self.broker = broker
        self.counter = redis.Redis.from_url(broker.redis_url(6))
        dsn = instance.pg_dsn("bench")
        events = SYSTEMS[system].events
        # jobsapp as docker-compose ships it: Redis broker plus the Redis dedup fast path.
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "JOBSAPP_DATABASE_URL": instance.pg_url("bench"),
            "JOBSAPP_BROKER_URL": broker.redis_url(5),
            "JOBSAPP_REDIS_URL": broker.redis_url(9),
            "JOBSAPP_STORAGE_URL": f"file://{ROOT}/var/bench/storage",
            "JOBSAPP_IMPORTS": "bench.lifecycle_tasks",
            "BENCH_COUNTER_URL": broker.redis_url(6),
            "BENCH_NAIVE_DSN": dsn,
            "BENCH_PEER_DSN": dsn,
            **(events or OFF).env(),
            **(SYSTEMS[system].env or {}),
        }

    def worker(self) -> subprocess.Popen[bytes]:
        log = (self.out / f"worker-{self.system}-{self.instance.name}.log").open("ab")
        return subprocess.Popen(
            list(SYSTEMS[self.system].worker),
            env=self.env,
            cwd=DEPLOYMENT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_done(self, n: int, worker: subprocess.Popen[bytes] | None, limit: float) -> float:
        deadline = time.monotonic() + limit
        while int(self.counter.get(DONE_KEY) or 0) < n:
            if worker is not None and worker.poll() is not None:
                raise RuntimeError(
                    f"{self.system} worker exited ({worker.returncode}); see {self.out}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.system}: {n} jobs not done in {limit:.0f}s")
            time.sleep(0.002)
        return time.time()

    def settle(self, limit: float) -> None:
        """Waits until the journal holds every job finished."""
        journal = SYSTEMS[self.system].journal
        if journal is None:
            return
        deadline = time.monotonic() + limit
        with _connection(self.instance) as cur:
            while _scalar(cur, journal.unfinished):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.system}: jobs not finished in {limit:.0f}s")
                time.sleep(0.01)

    def journal_rows(self) -> dict[str, int]:
        """Rows in each journal table (none where the schema has no such table)."""
        journal = SYSTEMS[self.system].journal
        if journal is None:
            return {}
        with _connection(self.instance) as cur:
            return {
                table: _scalar(
                    cur, sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
                )
                if _exists(cur, table)
                else 0
                for table in journal.tables
            }


@contextlib.contextmanager
def _connection(instance: Instance) -> Iterator[Any]:
    conn = psycopg2.connect(instance.pg_dsn("bench"))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            yield cur
    finally:
        conn.close()


def _scalar(cur: Any, query: Any, params: Sequence[object] = ()) -> int:
    cur.execute(query, params)
    return int(cur.fetchone()[0])


def _exists(cur: Any, table: str) -> bool:
    return bool(_scalar(cur, "SELECT (to_regclass(%s) IS NOT NULL)::int", (table,)))


def stop(worker: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker's process group: every job has run (and is finished in the
    journal) by now, and a graceful shutdown would only add seconds to each of the many
    measurements."""
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
    return {
        "worker": tree_cpu(worker.pid),
        "postgres": tree_cpu(run.instance.pid("postgres/data/postmaster.pid")),
        "redis": tree_cpu(run.broker.pid("redis/redis.pid")),
    }


def measure(run: Run, n: int) -> Sample:
    limit = 120 + n / 5  # a stuck system fails the run instead of hanging it
    run.counter.delete(DONE_KEY)
    rows0 = run.journal_rows()
    producer, worker = Producer(run), None
    try:
        producer.send(n)
        enqueue = n / producer.result()["seconds"]
        worker = run.worker()
        first = run.wait_done(1, worker, limit)
        drain = (n - 1) / max(run.wait_done(n, worker, limit) - first, 1e-6) if n > 1 else 0.0
        run.counter.delete(DONE_KEY)
        cpu0, wal0 = cpu_now(run, worker), wal_syncs(run.instance)
        producer.send(n)
        done = run.wait_done(n, worker, limit)
        sent = producer.result()
        producer.close()
        run.settle(limit)  # the last finishes are part of the jobs' cost
        cpu1, wal1 = cpu_now(run, worker), wal_syncs(run.instance)
    finally:
        producer.kill()
        if worker is not None:
            stop(worker)
    cpu_ms = {"producer": sent["cpu"] * 1000 / n}
    cpu_ms.update({k: (cpu1[k] - cpu0[k]) * 1000 / n for k in cpu0})
    # Both phases' jobs: 2n, every one of them finished.
    rows = {table: (count - rows0[table]) / (2 * n) for table, count in run.journal_rows().items()}
    return Sample(enqueue, drain, n / (done - sent["start"]), cpu_ms, (wal1 - wal0) / n, rows)


def prepare(envs: Mapping[Instance, Mapping[str, str]]) -> None:
    """jobsapp's schema (its migrations), the naive tables and Procrastinate's schema, on
    every cluster at once (each command is mostly its own start-up)."""
    commands = (
        [sys.executable, "-m", "jobsapp.cli", "db", "upgrade"],
        [str(BIN / "procrastinate"), "--app=bench.peer_procrastinate.app", "schema", "--apply"],
    )
    started = [
        subprocess.Popen(
            command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for env in envs.values()
        for command in commands
    ]
    for instance in envs:
        naive.create_schema(instance.pg_dsn("bench"))
    for process in started:
        output, _ = process.communicate(timeout=300)
        if process.returncode != 0:
            raise RuntimeError(f"{process.args!r} exited {process.returncode}: {output.decode()}")


Results = dict[tuple[str, str], list[Sample]]  # (cluster, system) -> one sample per round
CLUSTERS = {"on": "durable", "off": "fast"}


def clusters(results: Results) -> list[str]:
    """The fsync settings measured: both, or "on" alone (a smoke run)."""
    return [fsync for fsync in CLUSTERS if (fsync, BASELINE) in results]


def run(services: Services, n: int, rounds: int, out: Path) -> Results:
    instances = {"on": services.durable}
    if services.fast is not None:
        instances["off"] = services.fast
    prepare({i: Run("lifecycle", i, services.durable, out).env for i in instances.values()})
    for db in (5, 9):
        redis.Redis.from_url(services.durable.redis_url(db)).flushdb()
    print(
        f"jobsapp's celeryconfig.py ships task events {SHIPPED.label}; the table's "
        f"+events: worker and sent events on, neither: both off",
        flush=True,
    )
    results: Results = {}
    for number in range(1, rounds + 1):
        for fsync, instance in instances.items():
            for system in SYSTEMS:
                sample = measure(Run(system, instance, services.durable, out), n)
                results.setdefault((fsync, system), []).append(sample)
                print(
                    round_line(
                        f"round {number} fsync {fsync:<3}",
                        system,
                        sample,
                        results[(fsync, BASELINE)][-1],
                    ),
                    flush=True,
                )
            print(
                f"round {number} fsync {fsync:<3} e2e: "
                + _ratios(compared(results, fsync, round_index=-1)),
                flush=True,
            )
    return results


def round_line(prefix: str, system: str, s: Sample, bare: Sample) -> str:
    cpu = " + ".join(f"{s.cpu_ms[p]:.2f}" for p in PROCESSES)
    return (
        f"{prefix} {system:<16} enqueue {s.enqueue:6.0f}/s  drain {s.drain:6.0f}/s  "
        f"e2e {s.e2e:6.0f}/s  e2e/bare {s.e2e / bare.e2e:4.2f}  cpu ms {cpu}  "
        f"wal {s.wal_syncs:.2f}  rows {s.rows_per_job:.2f}"
    )


def compared(results: Results, fsync: str, round_index: int | None = None) -> dict[str, float]:
    """End-to-end ratio of each compared pair of systems: of one round, or the median over
    rounds (None)."""
    found = {}
    for c in COMPARISONS:
        num, den = results[(fsync, c.jobsapp)], results[(fsync, c.peer)]
        if round_index is not None:
            num, den = [num[round_index]], [den[round_index]]
        found[f"{c.jobsapp}/{c.peer}"] = median_ratio(num, den, "e2e")
    return found


def _ratios(ratios: Mapping[str, float]) -> str:
    return "; ".join(f"{name} {ratio:.2f}" for name, ratio in ratios.items())


def median_ratio(num: Sequence[Sample], den: Sequence[Sample], field: str) -> float:
    """The median over rounds of the per-round ratio (rounds share the machine's drift)."""
    ratios = [float(getattr(a, field) / getattr(b, field)) for a, b in zip(num, den, strict=True)]
    return statistics.median(ratios)


def report(results: Results, n: int, rounds: int) -> list[str]:
    """Prints the tables; returns the ratio lines (the last lines printed)."""
    print(
        f"\n{n} no-op jobs x {rounds} interleaved rounds; medians. CPU ms per job (end to "
        f"end) by process; WAL syncs per job (pg_stat_wal.wal_sync); journal rows written "
        f"per job. Task events as shipped: {SHIPPED.label}."
    )
    for fsync in clusters(results):
        print(
            f"\n-- Postgres fsync {fsync}\n{'system':<16} {'enqueue/s':>9} {'drain/s':>8} "
            f"{'e2e/s':>7}  " + " ".join(f"{p:>8}" for p in PROCESSES) + "  wal/job rows/job"
        )
        for system in SYSTEMS:
            samples = results[(fsync, system)]
            rates = [statistics.median(getattr(s, f) for s in samples) for f in FIELDS]
            cpu = [statistics.median(s.cpu_ms[p] for s in samples) for p in PROCESSES]
            wal = statistics.median(s.wal_syncs for s in samples)
            rows = statistics.median(s.rows_per_job for s in samples)
            print(
                f"{system:<16} {rates[0]:9.0f} {rates[1]:8.0f} {rates[2]:7.0f}  "
                + " ".join(f"{c:8.2f}" for c in cpu)
                + f"  {wal:7.2f} {rows:8.2f}"
            )
        print("e2e, medians of the rounds' ratios: " + _ratios(compared(results, fsync)))
    print(
        "\njournal rows per job by table (fsync on, medians): "
        + "; ".join(
            f"{system} "
            + " + ".join(
                f"{table} {_median_rows(results, system, table):.2f}" for table in journal.tables
            )
            for system, journal in _journals()
        )
    )
    lines = ratio_lines(results)
    print("\n" + "\n".join(lines))
    return lines


def _journals() -> list[tuple[str, Journal]]:
    return [(name, s.journal) for name, s in SYSTEMS.items() if s.journal is not None]


def _median_rows(results: Results, system: str, table: str) -> float:
    return statistics.median(s.rows.get(table, 0.0) for s in results[("on", system)])


def ratio_lines(results: Results) -> list[str]:
    lines = []
    measured = clusters(results)
    for fsync in measured:
        for c in COMPARISONS:
            for field in c.fields:
                ratio = median_ratio(results[(fsync, c.jobsapp)], results[(fsync, c.peer)], field)
                lines.append(f"{c.label} {field} ratio (fsync {fsync}{c.qualifier}): {ratio:.2f}")
    if measured == list(CLUSTERS):
        for system in SYSTEMS:
            ratio = median_ratio(results[("on", system)], results[("off", system)], "e2e")
            lines.append(f"{system} fsync on/off e2e ratio: {ratio:.2f}")
    as_shipped = results[("on", COMPARISONS[0].jobsapp)]
    rows = statistics.median(s.rows_per_job for s in as_shipped)
    lines.append(f"lifecycle journal rows per job: {rows:.2f}")
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
        values = [
            statistics.median(s.cpu_ms[process] for s in results[("on", name)]) for name in systems
        ]
        cpu.bar(systems, values, bottom=bottom, label=process)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    cpu.set_ylabel("CPU ms per job, fsync on (median)")
    cpu.tick_params(axis="x", rotation=20)
    cpu.legend()


SIZES = {"full": (3000, 4), "quick": (200, 1), "smoke": (10, 1)}
# Batches of 1,000 timed by bench/batch_publish.py, per size.
BATCH_ROUNDS = {"full": 9, "quick": 3, "smoke": 1}


def batch_lines(services: Services, rounds: int, out: Path) -> list[str]:
    """The batch path alone: ``enqueue.transaction()`` of 1,000 jobs, published and marked
    sent, on the fsync-on cluster with no worker running (as shipped: sent events per
    settings), and its ratio to bare Celery publishing as many in one Redis pipeline."""
    env = Run("lifecycle-batch", services.durable, services.durable, out).env
    done = subprocess.run(
        [sys.executable, "-m", "bench.batch_publish", str(rounds)],
        env=env,
        cwd=DEPLOYMENT,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for name, key in (("lifecycle-batch", "rounds"), ("bare pipeline", "bare")):
        each = " ".join(f"{rate:.0f}" for rate in found[key])
        print(f"{name} of 1000, rounds (jobs/s): {each}", flush=True)
    ratio = statistics.median(
        ours / bare for ours, bare in zip(found["rounds"], found["bare"], strict=True)
    )
    return [
        f"batch enqueue jobs per second: {found['median']:.0f}",
        f"batch enqueue/bare pipeline ratio (fsync on): {ratio:.2f}",
    ]


# The Redis database of the counted jobs' messages (Run uses 5, 6 and 9).
COST_DB = 13


def calls_lines(services: Services) -> list[str]:
    """jobsapp's Python calls per no-op job over bare Celery's, in the task's execution
    (``worker``), in a whole solo worker and on the producer, counted as the cost budget
    counts them (bench/cost.py: the same events on both sides), on the fsync-on cluster's
    journal."""
    env = {
        **os.environ,
        "JOBSAPP_DATABASE_URL": services.durable.pg_url("bench"),
        "JOBSAPP_BROKER_URL": services.durable.redis_url(COST_DB),
        "JOBSAPP_STORAGE_URL": f"file://{ROOT}/var/bench/storage",
    }
    ours = cost.measured("lifecycle", "bench-cost", env, cost.NOOP)[cost.NOOP]
    theirs = cost.measured("bare", "bench-cost", env)[cost.BARE]
    lines = [
        f"lifecycle/bare {side} calls per job: {ours[side]['calls'] / theirs[side]['calls']:.2f}"
        for side in ("worker", cost.SOLO, "producer")
    ]
    print("\n".join(lines), flush=True)
    return lines


def main(services: Services, size: str, out: Path) -> list[str]:
    n, rounds = SIZES[size]
    results = run(services, n, rounds, out)
    lines = report(results, n, rounds)
    plot(results, out / "lifecycle.png")
    # Before the journal-rows line, which stays the last.
    lines[-1:-1] = [*batch_lines(services, BATCH_ROUNDS[size], out), *calls_lines(services)]
    return lines
