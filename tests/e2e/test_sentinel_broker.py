"""Redis behind Sentinel as the broker, as a Celery team runs it for a Redis that fails
over: ``JOBSAPP_BROKER_URL=sentinel://host:port`` and the master's name in the
deployment's ``broker_transport_options``. A real worker, beat and producers on a master,
its replica and a sentinel; the sentinel fails the master over to the replica between two
rounds of jobs, and every job of both rounds succeeds, once. Before, ``sentinel://`` was
refused as a broker scheme."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.support.procs import ROOT, launching, ready, service_env
from tests.support.rounds import echo_round
from tests.support.servers import RedisServer, SentinelServer
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[SentinelServer]:
    master = RedisServer(tmp_path / "master", dies_with_pytest=True)
    master.start()
    replica = RedisServer(tmp_path / "replica", dies_with_pytest=True, replica_of=master.port)
    replica.start()
    watcher = SentinelServer(tmp_path / "sentinel", dies_with_pytest=True, master=master.port)
    watcher.start()
    try:
        yield watcher
    finally:
        for server in (watcher, replica, master):
            server.close()


def test_a_sentinel_broker_carries_jobs_through_a_failover(
    pg: Engine,
    postgres_url: str,
    sentinel: SentinelServer,
    module_redis: RedisServer,
    tmp_path: Path,
) -> None:
    (tmp_path / "deploy_settings.py").write_text(
        f"broker_transport_options = {{'master_name': {SentinelServer.MASTER!r}}}\n"
    )
    env = service_env(
        database_url=postgres_url,
        broker_url=sentinel.url,
        var_dir=tmp_path / "var",
        settings={
            "CELERY_CONFIG_MODULE": "deploy_settings",
            "PYTHONPATH": f"{ROOT}:{tmp_path}",
            "JOBSAPP_TEST_REDIS_URL": module_redis.url,  # the bodies' run counters
            "JOBSAPP_REDIS_URL": "",  # the dedup fast path is a plain Redis URL's: none
        },
    )
    with launching(env, tmp_path) as launcher:
        ready(launcher.worker(f"sentinel-{uuid.uuid4().hex[:6]}"), launcher.beat("beat"))
        echo_round(launcher, pg, module_redis)
        before = sentinel.master_port()
        with sentinel.client() as client:
            eventually(lambda: client.sentinel_slaves(SentinelServer.MASTER), timeout=30)
            client.execute_command("SENTINEL", "FAILOVER", SentinelServer.MASTER)
        eventually(lambda: sentinel.master_port() != before, timeout=30)
        echo_round(launcher, pg, module_redis)


def test_a_sentinel_broker_without_its_masters_name_is_one_line(
    postgres_url: str, tmp_path: Path
) -> None:
    env = service_env(
        database_url=postgres_url,
        broker_url="sentinel://127.0.0.1:26379",
        var_dir=tmp_path / "var",
        settings={"JOBSAPP_REDIS_URL": ""},
    )
    worker = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "jobsapp", "worker"],
        cwd=tmp_path,  # no deployment settings module here
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert worker.returncode == 2
    assert worker.stderr.strip().splitlines()[-1] == (
        "jobsapp: configuration error: JOBSAPP_BROKER_URL names Redis Sentinel but no master: "
        'set broker_transport_options = {"master_name": "..."} in the deployment\'s '
        "celeryconfig (kept beside jobsapp's own options)"
    )
