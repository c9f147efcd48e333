"""The reprocess backfill as a lifecycle job, killed twice (SIGKILL of its worker).

Real processes: ``jobsapp reprocess --as-job`` enqueues it, ``celery -A jobsapp worker``
runs it, ``jobsapp maintenance run-once --pass reaper`` requeues it after each kill. The
2,000 attachment jobs it enqueues are parked on a queue no worker here consumes: the test
checks the backfill's own bookkeeping and the jobs it made, not their renders.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text

from jobsapp.attachments.models import REPROCESS, RUNS
from jobsapp.db import make_engine
from tests.support.databases import drop_postgres, fresh_postgres, migrate
from tests.support.env import SESSION, service
from tests.support.journal_view import events
from tests.support.planted import plant_rows
from tests.support.procs import Launcher, Proc, launching, ready, service_env
from tests.support.servers import RedisServer
from tests.support.waiting import eventually

ATTACHMENT_COUNT = 2000
STALE_AFTER_S = 3

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def db() -> Iterator[Engine]:
    admin = service("JOBSAPP_TEST_DATABASE_URL")
    url = fresh_postgres(admin, f"jobsapp_e2e_backfill_{SESSION}")
    migrate(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()
    drop_postgres(admin, f"jobsapp_e2e_backfill_{SESSION}")


@pytest.fixture
def procs(db: Engine, module_redis: RedisServer, tmp_path: Path) -> Iterator[Launcher]:
    broker = module_redis.url
    module_redis.client().flushdb()
    settings = {
        "JOBSAPP_STORAGE_URL": f"s3://{service('JOBSAPP_TEST_S3_BUCKET')}/e2e-backfill-{SESSION}",
        "JOBSAPP_S3_ENDPOINT_URL": service("JOBSAPP_TEST_S3_ENDPOINT_URL"),
        "JOBSAPP_IMPORTS": "tests.support.parked",
        "JOBSAPP_HEARTBEAT_INTERVAL": "0.5",
        "JOBSAPP_STALE_AFTER": str(STALE_AFTER_S),
    }
    env = service_env(
        database_url=db.url.render_as_string(hide_password=False),
        broker_url=broker,
        var_dir=tmp_path / "var",
        settings=settings,
    )
    with launching(env, tmp_path) as launcher:
        yield launcher


def backfill(db: Engine) -> dict[str, Any]:
    with db.connect() as conn:
        return dict(conn.execute(select(REPROCESS)).mappings().one())


def worker(procs: Launcher, name: str) -> Proc:
    proc = procs.worker(name)
    ready(proc)
    return proc


def kill_after(db: Engine, proc: Proc, scanned: int, attempt: int) -> dict[str, Any]:
    """SIGKILL ``proc`` once the backfill's attempt has scanned ``scanned`` attachments."""
    eventually(
        lambda: (row := backfill(db))["attempts"] == attempt and row["scanned"] >= scanned,
        timeout=120,
        interval=0.02,
    )
    proc.kill()
    return backfill(db)


def stale(db: Engine) -> bool:
    """The backfill's heartbeat is older than the stale limit, on the database's clock."""
    query = text("SELECT heartbeat_at < now() - make_interval(secs => :stale) FROM reprocess_runs")
    with db.connect() as conn:
        return bool(conn.execute(query, {"stale": STALE_AFTER_S}).scalar_one())


def reap(procs: Launcher, db: Engine) -> None:
    """The reaper, once the dead run's heartbeat is stale, requeues and publishes it."""
    # Each pass is a process of its own: asked only once there is something to reap.
    eventually(lambda: stale(db), timeout=STALE_AFTER_S * 10, interval=0.2)

    def requeued() -> bool:
        proc = procs.jobsapp("reaper", "maintenance", "run-once", "--pass", "reaper")
        assert proc.wait(60) == 0, proc.log()
        return '"reprocess": 1' in proc.log()

    eventually(requeued, timeout=STALE_AFTER_S * 10, interval=1.0)


def test_a_backfill_killed_twice_resumes_from_its_cursor(procs: Launcher, db: Engine) -> None:
    plant_rows(db, ATTACHMENT_COUNT)
    first = worker(procs, "w1")
    start = procs.jobsapp(
        "start", "reprocess", "--to-version", "2", "--batch", "50", "--pause", "0.05", "--as-job"
    )
    assert start.wait(60) == 0, start.log()
    assert "backfill to v2: job" in start.log()

    killed = [kill_after(db, first, 500, attempt=1)]
    reap(procs, db)
    second = worker(procs, "w2")
    killed.append(kill_after(db, second, killed[0]["scanned"] + 500, attempt=2))
    reap(procs, db)
    worker(procs, "w3")
    done = eventually(lambda: (row := backfill(db))["state"] == "succeeded" and row, timeout=180)

    for row in killed:
        assert row["state"] == "running"
        assert 0 < row["scanned"] < ATTACHMENT_COUNT
    assert killed[0]["scanned"] < killed[1]["scanned"]
    # Step statistics add up, and no batch was done twice.
    assert done["scanned"] == ATTACHMENT_COUNT
    assert done["scanned"] == done["enqueued"] + done["skipped"] + done["failed"]
    assert (done["enqueued"], done["skipped"], done["failed"]) == (ATTACHMENT_COUNT, 0, 0)
    assert done["attempts"] == 3
    with db.connect() as conn:
        jobs = conn.execute(select(func.count()).where(RUNS.c.pipeline_version == 2))
        assert jobs.scalar_one() == ATTACHMENT_COUNT
    moves = [(e["transition"], e["attempt"]) for e in events(db, done["job_id"])]
    assert [tuple(m) for m in moves] == [
        ("enqueue", 1),
        ("claim", 1),
        ("reap_requeue", 1),
        ("claim", 2),
        ("reap_requeue", 2),
        ("claim", 3),
        ("succeed", 3),
    ]
