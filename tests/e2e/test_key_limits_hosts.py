"""``limit=N`` and ``fair`` across hosts: four worker hosts of two children each (distinct
worker names, real prefork processes), a beat, a producer process, a private Redis and a
Postgres database of this module's own.

Every body writes its start and end on the database's clock into ``limit_probe``
(tests/support/limit_tasks.py); a sampler reads ``key_slots`` while the jobs run. What a
user checks: no more than N bodies of a key ever run at once, and N do; no key has a free
slot and a waiting run for longer than one relay tick; a tenant's short queue is not
starved by another tenant's long one.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from tests.support import limit_tasks
from tests.support.databases import migrated_postgres
from tests.support.env import SESSION
from tests.support.procs import BIN, WORKER_FLAGS, Launcher, Proc, launching, ready, service_env
from tests.support.servers import RedisServer
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(240)

HOSTS, CHILDREN = 4, 2
# The relay's default tick (celeryconfig.py): a free slot may wait at most this long.
RELAY_TICK = 2.0
IMPORTS = "tests.support.tasks,tests.support.limit_tasks"
# Long enough that a published message is claimed well within a body of its key.
BODY = 0.3


@dataclass
class Cluster:
    launcher: Launcher
    engine: Engine
    workers: list[Proc] = field(default_factory=list)

    def produce(self, task: str, calls: Sequence[tuple[str, float]]) -> None:
        argv = [sys.executable, "-m", "tests.support.limit_tasks", task, json.dumps(calls)]
        producer = self.launcher.start("producer", argv)
        assert producer.wait(120) == 0, producer.log()

    def finished(self, count: int) -> bool:
        with self.engine.connect() as conn:
            done = conn.execute(text("SELECT count(*) FROM job_runs WHERE state = 'succeeded'"))
            return int(done.scalar_one()) >= count

    def probes(self, task: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT p.key, p.started_at, p.ended_at, r.created_at FROM limit_probe p "
                    "JOIN job_runs r ON r.job_id = p.job_id WHERE p.task = :t"
                ),
                {"t": task},
            )
            return [dict(r) for r in rows.mappings()]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        with migrated_postgres(f"jobsapp_e2e_limits_{SESSION}") as url:
            engine = create_engine(url)
            with engine.begin() as conn:
                conn.execute(text(limit_tasks.PROBE_DDL))
            env = service_env(
                database_url=url,
                broker_url=server.url,
                var_dir=tmp_path,
                settings={"JOBSAPP_IMPORTS": IMPORTS},
            )
            with launching(env, tmp_path) as launcher:
                yield Cluster(launcher, engine)
            engine.dispose()
    finally:
        server.close()


def start_hosts(cluster: Cluster) -> None:
    flags = list(WORKER_FLAGS)
    flags[flags.index("-c") + 1] = str(CHILDREN)
    argv = [str(BIN / "celery"), "-A", "jobsapp", "worker", *flags]
    cluster.workers = [
        cluster.launcher.start(f"host{i}", [*argv, "-n", f"host{i}@%h"]) for i in range(HOSTS)
    ]
    beat = cluster.launcher.beat("beat")
    ready(*cluster.workers, beat, timeout=120)


def most_at_once(spans: Sequence[tuple[datetime, datetime]]) -> int:
    """The most spans open at one instant; an end before a start at the same instant."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


class SlotSampler(threading.Thread):
    """Reads ``key_slots`` every 50 ms: the longest time any key was seen with a waiting
    run and a free slot (each read is one snapshot)."""

    def __init__(self, engine: Engine, limit: int) -> None:
        super().__init__(daemon=True)
        self.engine, self.limit = engine, limit
        self.stop = threading.Event()
        self.longest = 0.0
        self.samples = 0
        self._since: dict[str, float] = {}

    def run(self) -> None:
        while not self.stop.wait(0.05):
            with self.engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT concurrency_key, count(slot_no), count(*) - count(slot_no) "
                        "FROM key_slots GROUP BY concurrency_key"
                    )
                ).all()
            self.samples += 1
            now = time.monotonic()
            starved = {key for key, held, waiting in rows if waiting and held < self.limit}
            for key in starved:
                self.longest = max(self.longest, now - self._since.setdefault(key, now))
            self._since = {k: v for k, v in self._since.items() if k in starved}


def test_200_jobs_over_4_keys_with_limit_3_on_4_hosts_run_exactly_3_per_key(
    cluster: Cluster,
) -> None:
    start_hosts(cluster)
    keys = [f"k{i}" for i in range(4)]
    sampler = SlotSampler(cluster.engine, limit_tasks.LIMIT)
    sampler.start()
    # One producer, two keys first: while it enqueues their 100 jobs, their 6 slots fit
    # the 8 children, so each runs 3 at once. Then two more keys, at once: 12 slots for 8
    # children, the limit under contention, until the first two drain (they started
    # ahead) and the last two have the children to run 3 at once each.
    cluster.produce(
        "tests.limited",
        [(keys[i % 2], BODY) for i in range(100)] + [(keys[2 + i % 2], BODY) for i in range(100)],
    )
    eventually(lambda: cluster.finished(200), timeout=150, interval=0.5)
    sampler.stop.set()
    sampler.join()
    probes = cluster.probes("limited")
    assert len(probes) == 200
    peaks = {
        k: most_at_once([(p["started_at"], p["ended_at"]) for p in probes if p["key"] == k])
        for k in keys
    }
    assert peaks == dict.fromkeys(keys, limit_tasks.LIMIT), peaks
    # The four keys did contend: the last two started before the first two drained.
    first_two_done = max(p["ended_at"] for p in probes if p["key"] in keys[:2])
    assert min(p["started_at"] for p in probes if p["key"] in keys[2:]) < first_two_done
    assert sampler.samples > 10
    assert sampler.longest < RELAY_TICK, sampler.longest
    with cluster.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM key_slots")).scalar_one() == 0


def test_a_fair_task_serves_a_tenant_of_10_before_another_tenants_backlog_of_500(
    cluster: Cluster,
) -> None:
    # Both backlogs are in the journal before any worker listens: the worst case for B.
    cluster.produce("tests.fair_tenant", [("A", 0.02)] * 500 + [("B", 0.02)] * 10)
    start_hosts(cluster)
    eventually(lambda: cluster.finished(510), timeout=180, interval=0.5)
    with cluster.engine.connect() as conn:
        order = (
            conn.execute(
                text(
                    "SELECT concurrency_key FROM job_runs WHERE task_name = 'tests.fair_tenant' "
                    "ORDER BY finished_at"
                )
            )
            .scalars()
            .all()
        )
    a_before_last_b = order[: max(i for i, key in enumerate(order) if key == "B")].count("A")
    print(f"fair: A finished {a_before_last_b} of 500 before B's last of 10")
    assert a_before_last_b < 100, a_before_last_b
