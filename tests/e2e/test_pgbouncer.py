"""jobsapp behind PgBouncer in transaction pooling mode, with real processes.

Two workers (distinct host names), two beats and a producer reach Postgres only through
a PgBouncer of this module's own (``scripts/services.sh start pgbouncer``, pool_mode =
transaction, two server connections for all of them) in front of the test Postgres; the
broker is a private Redis. Under transaction pooling a server connection serves another
client after every transaction, so anything session-level (a startup option, ``SET``
outside ``SET LOCAL``, a session advisory lock) is refused or leaks; these tests are
what shows jobsapp uses none.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg2
import psycopg2.extensions
import pytest
import redis
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url

from jobsapp.db import autocommit, make_engine
from tests.support.databases import migrated_postgres
from tests.support.env import SESSION, service
from tests.support.journal_view import run_row, transitions
from tests.support.planted import one_job_run
from tests.support.procs import Launcher, Proc, ready, service_env
from tests.support.servers import RedisServer
from tests.support.waiting import eventually
from tests.support.webserver import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "services.sh"
JOBS = 60
# Fewer server connections than clients (2 worker children, 2 workers, 2 beats, a
# producer): each client's transactions keep landing on connections others used.
SERVER_CONNECTIONS = 2
SETTINGS = {
    "JOBSAPP_BEAT_LEASE_SECONDS": "3",
    "JOBSAPP_RELAY_EVERY": "1",
    "JOBSAPP_REAPER_EVERY": "1",
}

pytestmark = pytest.mark.timeout(180)


def _services(state_dir: Path, pg_port: int, port: int, *args: str) -> None:
    env = {
        **os.environ,
        "JOBSAPP_SVC_DIR": str(state_dir),
        "JOBSAPP_PG_PORT": str(pg_port),
        "JOBSAPP_PGBOUNCER_PORT": str(port),
        "JOBSAPP_PGBOUNCER_POOL_SIZE": str(SERVER_CONNECTIONS),
    }
    done = subprocess.run(
        [str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def admin_url() -> str:
    return service("JOBSAPP_TEST_DATABASE_URL")


@pytest.fixture(scope="module")
def bouncer(admin_url: str) -> Iterator[int]:
    """The port of a PgBouncer in front of the test Postgres; its state dir is under the
    repository (the postgres user it runs as cannot reach pytest's /tmp)."""
    state_dir, port = ROOT / "var" / f"pgbouncer-test-{os.getpid()}", free_port()
    pg_port = make_url(admin_url).port or 5432
    try:
        _services(state_dir, pg_port, port, "start", "pgbouncer")
        yield port
    finally:
        _services(state_dir, pg_port, port, "stop", "pgbouncer")
        shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def direct(admin_url: str) -> Iterator[Engine]:
    """This module's database, reached directly (what the test reads); dropped at the end."""
    name = f"jobsapp_pgbouncer_{SESSION}"
    admin = create_engine(
        make_url(admin_url).set(database="postgres"), isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine = make_engine(make_url(admin_url).set(database=name).render_as_string(False))
    yield engine
    engine.dispose()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def procs(direct: Engine, bouncer: int, tmp_path: Path) -> Iterator[Launcher]:
    """Every process reaches the database through PgBouncer only, migrations included."""
    redis_server = RedisServer(tmp_path / "redis")
    redis_server.start()
    through = direct.url.set(port=bouncer).render_as_string(hide_password=False)
    env = service_env(
        database_url=through,
        broker_url=redis_server.url,
        settings=SETTINGS,
        var_dir=tmp_path / "var",
    )
    launcher = Launcher(env, tmp_path)
    try:
        upgrade = launcher.jobsapp("migrate", "db", "upgrade")
        assert upgrade.wait(120) == 0, upgrade.log()
        yield launcher
        launcher.dump_logs()
    finally:
        launcher.kill_all()
        redis_server.close()


def _ran(launcher: Launcher, tokens: list[str]) -> list[int]:
    client = redis.Redis.from_url(launcher.env["JOBSAPP_TEST_REDIS_URL"])
    return [int(v or 0) for v in client.mget([f"jobsapp-test:calls:{t}" for t in tokens])]


def _succeeded(direct: Engine) -> int:
    with direct.connect() as conn:
        query = text("SELECT count(*) FROM job_runs WHERE state = 'succeeded'")
        return int(conn.execute(query).scalar_one())


def _connections(bouncer: int, database: str) -> tuple[int, int]:
    """(client, server) connections PgBouncer holds for ``database``, from its console."""
    console = psycopg2.connect(host="127.0.0.1", port=bouncer, user="postgres", dbname="pgbouncer")
    console.autocommit = True  # the console runs no transactions
    counts = []
    with console.cursor() as cur:
        for what in ("CLIENTS", "SERVERS"):
            cur.execute(f"SHOW {what}")
            counts.append(sum(1 for row in cur.fetchall() if database in row))
    console.close()
    return counts[0], counts[1]


def _received(workers: list[Proc]) -> int:
    return sum(len(re.findall(r"Task tests\.echo\[[^\]]+\] received", w.log())) for w in workers)


def test_every_job_runs_once_through_transaction_pooling(
    procs: Launcher, direct: Engine, bouncer: int
) -> None:
    workers = [procs.worker(f"pgb{i}") for i in range(2)]
    beats = [procs.beat(f"beat{i}") for i in range(2)]
    ready(*workers, *beats, timeout=60)
    tokens = [f"pgb-{uuid.uuid4().hex[:12]}" for _ in range(JOBS)]
    sent = procs.enqueue(
        *({"task": "tests.echo", "kwargs": {"token": t}} for t in tokens), timeout=60
    )
    assert [s["outcome"] for s in sent] == ["enqueued"] * JOBS
    eventually(lambda: _succeeded(direct) == JOBS, timeout=90)
    assert _ran(procs, tokens) == [1] * JOBS
    clients, servers = _connections(bouncer, direct.url.database or "")
    assert clients > SERVER_CONNECTIONS >= servers
    # Each job's message was published once: the producer's own published mark took,
    # so the relay had nothing to send again.
    assert _received(workers) == JOBS
    producer = procs.started[-1].log()
    assert not re.search(r"failed|Error", producer), producer[:600]


def _grab_on(bouncer: int, database: str, statement: str) -> Callable[[], None]:
    """Arranges that ``statement``, when next sent through PgBouncer, lands on another
    server connection than the one just used: right before it, a second client begins a
    transaction and so holds that one (PgBouncer hands out the last released first).
    Returns the release."""
    other = psycopg2.connect(host="127.0.0.1", port=bouncer, user="postgres", dbname=database)

    def grab(_conn: object, _cursor: object, sent: str, *_args: object) -> None:
        if statement in sent and other.status == psycopg2.extensions.STATUS_READY:
            other.cursor().execute("SELECT 1")  # BEGIN implied: the server stays held

    event.listen(Engine, "before_cursor_execute", grab)

    def release() -> None:
        event.remove(Engine, "before_cursor_execute", grab)
        other.close()

    return release


def test_a_schema_change_met_behind_pgbouncer_falls_back_to_unprepared(
    bouncer: int, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"jobsapp_pgb_reprepare_{SESSION}"
    with migrated_postgres(name) as url:
        through = make_url(url).set(port=bouncer).render_as_string(hide_password=False)
        engine = make_engine(f"{through}?application_name=pgb-reprepare")
        with autocommit(engine) as conn:
            one_job_run(conn)  # prepared on the one server connection this client used
            # A rolling deploy changes a column the claim returns ...
            with create_engine(url).begin() as ddl:
                ddl.exec_driver_sql("DROP VIEW job_runs_all")
                ddl.exec_driver_sql("ALTER TABLE job_runs ALTER COLUMN worker TYPE varchar(300)")
            # ... and the re-prepare after "cached plan must not change result type" lands
            # on a server connection that never prepared the statement.
            release = _grab_on(bouncer, name, "DEALLOCATE jobsapp_")
            try:
                job_id = one_job_run(conn)
                after = one_job_run(conn)
            finally:
                release()
        for done in (job_id, after):
            assert run_row(engine, done)["state"] == "succeeded"
            assert transitions(engine, done) == ["enqueue", "claim", "succeed"]
        engine.dispose()
    fallbacks = [r for r in caplog.records if "prepared statements do not survive" in r.message]
    assert len(fallbacks) == 1, [r.message for r in caplog.records]
