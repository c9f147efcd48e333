"""Soak: uploads through the real web while a killer SIGKILLs random workers.

Two supervised workers (a dead one is replaced, as systemd or Kubernetes would), beat with
the short cadences, and N uploads per phase: first without kills (the baseline), then
with a worker process group SIGKILLed every few seconds. At the end, over every upload:

- every accepted upload (202) is ``ready``, and its run succeeded exactly once;
- exactly one variant row per effect key, and every object's bytes hash to its row
  (variants and originals); nothing else under the published prefix;
- the outbox is drained: every row published, and each delivered or its job terminal;
- no staging object of a ready attachment survives staging retention;
- the throughput under kills is printed against the baseline.

The quick variant (N=30) runs in CI. The big one is marked ``soak`` and runs only when
asked: ``pytest tests/chaos/test_soak.py -m soak --soak-n 1000`` (or JOBSAPP_SOAK_N).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from sqlalchemy import func, select

from jobsapp.attachments.models import ATTACHMENT_RUNS, ATTACHMENTS, RUNS, VARIANTS
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import OUTBOX
from tests.chaos.harness import (
    PROMISED,
    Cluster,
    Killer,
    Web,
    photo,
    ready,
    sha256,
    staging_pass,
)
from tests.support.procs import Supervisor

QUICK_N = 30  # about 15 kills on a loaded 2-core machine; the soak marker runs 1000
DEFAULT_SOAK_N = 1000
WORKERS = 2
KILL_EVERY = 2.5  # seconds, on average
UPLOADERS = 4
# A phone photo scaled down: its variants take a worker about 0.2 s.
SIZE = (1024, 768)


@dataclass(frozen=True)
class Phase:
    name: str
    uploads: int
    seconds: float
    kills: int = 0

    @property
    def per_second(self) -> float:
        return self.uploads / self.seconds

    def line(self) -> str:
        kills = f", {self.kills} worker kills" if self.kills else ""
        return (
            f"{self.name}: {self.uploads} uploads ready in {self.seconds:.1f}s "
            f"= {self.per_second:.2f}/s{kills}"
        )


def _upload_all(cluster: Cluster, web: Web, n: int) -> list[uuid.UUID]:
    with ThreadPoolExecutor(UPLOADERS) as pool:
        return list(pool.map(lambda _: cluster.accepted(web, photo(SIZE)), range(n)))


def _all_ready(cluster: Cluster, ids: list[uuid.UUID], timeout: float) -> None:
    stmt = (
        select(func.count())
        .select_from(ATTACHMENTS)
        .where(ATTACHMENTS.c.id.in_(ids), ATTACHMENTS.c.state == "ready")
    )

    def done() -> bool:
        with cluster.engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one()) == len(ids)

    cluster.wait_for(done, f"{len(ids)} uploads ready", timeout)


def _phase(
    cluster: Cluster, web: Web, supervisor: Supervisor, n: int, *, kill: bool
) -> tuple[Phase, list[uuid.UUID]]:
    started = time.monotonic()
    killer = Killer(lambda: list(supervisor.workers), KILL_EVERY) if kill else None
    with killer or contextlib.nullcontext():
        ids = _upload_all(cluster, web, n)
        _all_ready(cluster, ids, timeout=60 + 2.0 * n)
    name = "with kills" if kill else "without kills"
    return Phase(name, n, time.monotonic() - started, killer.kills if killer else 0), ids


# ------------------------------------------------------------------------ invariants


def _check_runs(cluster: Cluster, ids: list[uuid.UUID]) -> None:
    with cluster.engine.connect() as conn:
        states = conn.execute(
            select(ATTACHMENTS.c.state, func.count())
            .where(ATTACHMENTS.c.id.in_(ids))
            .group_by(ATTACHMENTS.c.state)
        ).all()
        runs = conn.execute(
            select(RUNS.c.state, func.count())
            .where(RUNS.c.attachment_id.in_(ids))
            .group_by(RUNS.c.state)
        ).all()
        job_ids = conn.execute(select(RUNS.c.job_id).where(RUNS.c.attachment_id.in_(ids)))
        histories = [journal.history(conn, ATTACHMENT_RUNS, j) for j in job_ids.scalars()]
    # Each job's history, as its timeline reads it (event rows and what its row carries).
    succeeds = [sum(e["transition"] == "succeed" for e in h) for h in histories]
    claims = Counter(
        (e["job_id"], e["attempt"]) for h in histories for e in h if e["transition"] == "claim"
    )
    assert dict(states) == {"ready": len(ids)}
    assert dict(runs) == {"succeeded": len(ids)}
    assert succeeds == [1] * len(ids)
    assert set(claims.values()) == {1}


def _check_objects(cluster: Cluster, ids: list[uuid.UUID]) -> None:
    with cluster.engine.connect() as conn:
        variants = [
            dict(r)
            for r in conn.execute(
                select(VARIANTS).where(VARIANTS.c.attachment_id.in_(ids))
            ).mappings()
        ]
        originals = conn.execute(
            select(ATTACHMENTS.c.original_key, ATTACHMENTS.c.sha256).where(
                ATTACHMENTS.c.id.in_(ids)
            )
        ).all()
    per_attachment: dict[uuid.UUID, list[str]] = {}
    for v in variants:
        per_attachment.setdefault(v["attachment_id"], []).append(v["variant"])
    assert {a: sorted(names) for a, names in per_attachment.items()} == {
        a: list(PROMISED) for a in ids
    }
    expected = {v["object_key"]: v["sha256"] for v in variants}
    expected |= {key: digest for key, digest in originals}
    with ThreadPoolExecutor(8) as pool:
        actual = dict(
            zip(expected, pool.map(lambda k: sha256(cluster.store.get(k)), expected), strict=True)
        )
    assert actual == expected
    published = {info.key for info in cluster.store.list("attachments/")}
    assert published == set(expected), "objects without a row, or rows without an object"


def _check_outbox(cluster: Cluster) -> None:
    def drained() -> bool:
        with cluster.engine.connect() as conn:
            rows = conn.execute(
                select(OUTBOX.c.published_at, OUTBOX.c.delivered_at, RUNS.c.state).join(
                    RUNS, RUNS.c.job_id == OUTBOX.c.job_id
                )
            ).all()
        return all(
            p is not None and (d is not None or s in ("succeeded", "failed")) for p, d, s in rows
        )

    cluster.wait_for(drained, "outbox drained", 30)


def _check_staging(cluster: Cluster, ids: list[uuid.UUID]) -> int:
    """Staging objects of ready attachments left by kills; retention must remove them."""
    with cluster.engine.connect() as conn:
        staged = set(
            conn.execute(
                select(ATTACHMENTS.c.staging_key).where(ATTACHMENTS.c.id.in_(ids))
            ).scalars()
        )
    left = staged & cluster.staging_objects()
    name = staging_pass()
    if name is None:
        print(f"TODO: no staging retention pass yet; {len(left)} staging objects left")
        return len(left)
    cluster.maintenance(name)
    assert not staged & cluster.staging_objects(), "staging of ready attachments kept"
    assert not cluster.staging_objects(), "staging objects without a ready attachment"
    return len(left)


# ----------------------------------------------------------------------------- runs


@contextlib.contextmanager
def _deployment(cluster: Cluster) -> Iterator[tuple[Web, Supervisor]]:
    beat = cluster.beat()
    supervisor = Supervisor(cluster.launcher, size=WORKERS)
    web = cluster.web()
    ready(beat, *supervisor.workers, timeout=45)
    try:
        yield web, supervisor
    finally:
        supervisor.stop()


def soak(cluster: Cluster, n: int, capsys: pytest.CaptureFixture[str]) -> None:
    with _deployment(cluster) as (web, supervisor):
        baseline, calm_ids = _phase(cluster, web, supervisor, n, kill=False)
        chaos, chaos_ids = _phase(cluster, web, supervisor, n, kill=True)
        restarts = supervisor.restarts
    ids = calm_ids + chaos_ids
    _check_runs(cluster, ids)
    _check_objects(cluster, ids)
    _check_outbox(cluster)
    leftovers = _check_staging(cluster, ids)
    with capsys.disabled():
        print(f"\nsoak N={n} per phase, {WORKERS} workers")
        print(f"  {baseline.line()}")
        print(f"  {chaos.line()}, {restarts} restarts")
        print(
            f"  throughput under kills: {chaos.per_second / baseline.per_second:.0%} "
            f"of the baseline; {leftovers} staging objects left by kills, "
            f"removed by staging retention"
        )
    assert chaos.kills >= 1, "the killer never fired: the run proves nothing"


@pytest.mark.timeout(60 + 6 * QUICK_N)
def test_uploads_survive_random_worker_kills(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    soak(cluster, QUICK_N, capsys)


def _soak_n(config: pytest.Config) -> int | None:
    option = config.getoption("--soak-n", default=None)
    if option:
        return int(option)
    if os.environ.get("JOBSAPP_SOAK_N"):
        return int(os.environ["JOBSAPP_SOAK_N"])
    return None


@pytest.mark.soak
@pytest.mark.timeout(0)
def test_soak(
    request: pytest.FixtureRequest, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    soak(cluster, _soak_n(request.config) or DEFAULT_SOAK_N, capsys)
