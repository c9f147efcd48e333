"""Attachment operations with real processes: reprocess, verify --repair, staging retention.

Workers, beat and the commands are subprocesses on a database, a redis-server and an S3
prefix of this module's own. The commands run as ``python -m jobsapp.attachments.commands``,
the same handlers ``jobsapp reprocess`` and ``jobsapp verify`` call. Beat is there for
what it owns: the relay publishes a batch an interrupted command committed but did not
publish, and its first tick as leader runs every maintenance pass, staging retention too.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import Engine, func, select

from jobsapp.attachments.models import ATTACHMENT_RUNS, ATTACHMENTS, RUNS, VARIANTS
from jobsapp.db import make_engine
from jobsapp.schema import metadata
from jobsapp.storage import ObjectStore, store_from_url
from tests.support.attachments import sha256
from tests.support.databases import drop_postgres, fresh_postgres, migrate
from tests.support.env import SESSION, service
from tests.support.journal_view import per_job
from tests.support.planted import all_on, plant, plant_ready, stage
from tests.support.procs import Launcher, Proc, ready, service_env
from tests.support.servers import RedisServer
from tests.support.waiting import eventually
from tests.unit import images

DATABASE = f"jobsapp_e2e_attachments_ops_{SESSION}"
# 1.8 s: long enough that nothing is an orphan at birth, short enough to wait out.
ORPHAN_HOURS = 0.0005
COMMAND = (sys.executable, "-m", "jobsapp.attachments.commands")

pytestmark = pytest.mark.timeout(180)


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    admin = service("JOBSAPP_TEST_DATABASE_URL")
    url = fresh_postgres(admin, DATABASE)
    migrate(url)
    yield url
    drop_postgres(admin, DATABASE)


@pytest.fixture(scope="module")
def storage_url() -> str:
    return f"s3://{service('JOBSAPP_TEST_S3_BUCKET')}/e2e-ops-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(storage_url: str) -> Iterator[ObjectStore]:
    s3 = store_from_url(storage_url, endpoint_url=service("JOBSAPP_TEST_S3_ENDPOINT_URL"))
    yield s3
    for info in list(s3.list("")):
        s3.delete(info.key)


@pytest.fixture
def db(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    with engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    yield engine
    engine.dispose()


@pytest.fixture
def procs(
    db: Engine,
    store: ObjectStore,
    database_url: str,
    storage_url: str,
    module_redis: RedisServer,
    tmp_path: Path,
) -> Iterator[Launcher]:
    module_redis.client().flushdb()
    settings = {
        "JOBSAPP_STORAGE_URL": storage_url,
        "JOBSAPP_S3_ENDPOINT_URL": service("JOBSAPP_TEST_S3_ENDPOINT_URL"),
        "JOBSAPP_RELAY_EVERY": "1",
        "JOBSAPP_STAGING_ORPHAN_HOURS": str(ORPHAN_HOURS),
    }
    env = service_env(
        database_url=database_url,
        broker_url=module_redis.url,
        var_dir=tmp_path / "var",
        settings=settings,
    )
    launcher = Launcher(env, tmp_path)
    try:
        yield launcher
    finally:
        launcher.kill_all()
        launcher.dump_logs()


# ------------------------------------------------------------------ helpers


def command(procs: Launcher, name: str, *args: str) -> Proc:
    return procs.start(name, [*COMMAND, *args])


def finished(proc: Proc, timeout: float = 90) -> tuple[int, str]:
    return proc.wait(timeout), proc.log()


def count(db: Engine, stmt: object) -> int:
    with db.connect() as conn:
        return int(conn.execute(stmt).scalar_one())  # type: ignore[call-overload]


def v2_jobs(db: Engine) -> list[uuid.UUID]:
    with db.connect() as conn:
        return list(
            conn.execute(select(RUNS.c.job_id).where(RUNS.c.pipeline_version == 2)).scalars()
        )


def transitions_per_job(db: Engine, transition: str) -> set[int]:
    return set(per_job(db, transition, ATTACHMENT_RUNS).values())


# ------------------------------------------------------------------ reprocess

# Ten batches of 10, 0.25 s apart: Ctrl-C after the third leaves seven (1.75 s) undone.
COUNT = 100


def test_reprocess_of_100_attachments_survives_ctrl_c_and_does_nothing_twice(
    procs: Launcher, db: Engine, store: ObjectStore
) -> None:
    ids = plant_ready(db, store, COUNT)
    workers = [procs.worker(f"w{i}") for i in range(2)]
    beat = procs.beat("beat")
    ready(beat, *workers)

    # The command itself, with Ctrl-C's default handling restored in case this test runs
    # under a parent that ignores SIGINT (children inherit that).
    interruptible = [
        sys.executable,
        "-c",
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from jobsapp.attachments.commands import main; sys.exit(main())",
    ]
    args = ["reprocess", "--to-version", "2", "--batch", "10", "--pause", "0.25"]
    first = procs.start("reprocess-1", [*interruptible, *args])
    first.wait_for_log(rf"enqueued 30/{COUNT}")
    os.kill(first.pid, signal.SIGINT)
    code, out = finished(first)
    assert code == 130, out
    assert "interrupted after" in out
    committed = len(v2_jobs(db))
    assert 30 <= committed < COUNT, "the first run was not interrupted midway"

    code, out = finished(command(procs, "reprocess-2", "reprocess", "--to-version", "2"))
    assert code == 0, out
    # The first run's jobs are found (queued, running or already published), not made again.
    done = re.search(r"done: (\d+) attachments to v2: (\d+) enqueued, (\d+) already queued", out)
    assert done is not None, out
    assert int(done[2]) == COUNT - committed
    assert int(done[1]) == int(done[2]) + int(done[3])

    eventually(lambda: all_on(db, ids, 2), timeout=90)
    jobs = v2_jobs(db)
    assert len(jobs) == COUNT
    with db.connect() as conn:
        attempts = conn.execute(
            select(RUNS.c.state, RUNS.c.attempts, func.count())
            .where(RUNS.c.pipeline_version == 2)
            .group_by(RUNS.c.state, RUNS.c.attempts)
        ).all()
    assert [tuple(a) for a in attempts] == [("succeeded", 1, COUNT)]
    # One enqueue and one claim per job; one row per effect key.
    assert transitions_per_job(db, "enqueue") == {1}
    assert transitions_per_job(db, "claim") == {1}
    assert count(db, select(func.count()).select_from(VARIANTS)) == 3 * COUNT
    assert len(list(store.list("attachments/"))) == COUNT + 3 * COUNT

    # A third run finds nothing left to do.
    code, out = finished(command(procs, "reprocess-3", "reprocess", "--to-version", "2"))
    assert (code, "done: 0 attachments" in out) == (0, True), out


# ------------------------------------------------------------------ verify --repair


def test_verify_finds_drift_and_repair_publishes_again(
    procs: Launcher, db: Engine, store: ObjectStore
) -> None:
    a, b = plant_ready(db, store, 2, data=images.solid("PNG", (40, 30)))
    worker, beat = procs.worker("w"), procs.beat("beat")
    ready(worker, beat)
    # Planted without their variants: the first repair publishes them, as a rerun would.
    code, out = finished(command(procs, "verify-0", "verify"))
    assert code == 1, out
    assert out.count("NO_ROW") == 6
    code, out = finished(command(procs, "repair-0", "verify", "--repair", "--wait", "60"))
    assert code == 0, out

    keys = _variant_keys(db)
    lost, damaged = keys[(a, "thumbnail")], keys[(b, "crop")]
    store.delete(lost[0])
    forged = images.encode(Image.new("RGB", (7, 7)), "WEBP")
    store.delete(damaged[0])
    store.put_if_absent(damaged[0], forged, sha256(forged), "image/webp")
    orphan = f"attachments/{uuid.uuid4()}/v1/crop"
    store.put_if_absent(orphan, forged, sha256(forged), "image/webp")

    code, out = finished(command(procs, "verify-1", "verify"))
    assert code == 1, out
    assert f"MISSING  {a} v1 thumbnail: {lost[0]}" in out
    assert f"CORRUPT  {b} v1 crop: {damaged[0]}" in out
    assert f"ORPHAN   {orphan} " in out

    code, out = finished(command(procs, "repair-1", "verify", "--repair", "--wait", "60"))
    assert code == 0, out
    assert "after repair: 2 ready attachments, 8 objects checked; 0 problems, 0 orphans" in out
    assert sha256(store.get(lost[0])) == lost[1]
    assert sha256(store.get(damaged[0])) == damaged[1]
    assert store.head(orphan) is None
    assert finished(command(procs, "verify-2", "verify"))[0] == 0
    with db.connect() as conn:
        states = conn.execute(select(ATTACHMENTS.c.state, ATTACHMENTS.c.published_version)).all()
    assert [tuple(s) for s in states] == [("ready", 1)] * 2


def _variant_keys(db: Engine) -> dict[tuple[uuid.UUID, str], tuple[str, str]]:
    stmt = select(
        VARIANTS.c.attachment_id, VARIANTS.c.variant, VARIANTS.c.object_key, VARIANTS.c.sha256
    )
    with db.connect() as conn:
        return {(r.attachment_id, r.variant): (r.object_key, r.sha256) for r in conn.execute(stmt)}


# ------------------------------------------------------------------ staging retention


def test_beat_deletes_an_old_orphan_from_staging_and_keeps_current_work(
    procs: Launcher, db: Engine, store: ObjectStore
) -> None:
    orphan = stage(store)
    queued = plant(db, store, "queued", runs=((1, "queued"),))
    failed = plant(db, store, "failed", age=timedelta(days=1), runs=((1, "failed"),))
    time.sleep(ORPHAN_HOURS * 3600 + 0.5)

    beat = procs.beat("beat")
    beat.wait_for_log(r"staging retention: \{[^}]*'orphan': 1", timeout=30)
    assert store.head(orphan) is None
    assert store.head(queued) is not None
    assert store.head(failed) is not None
