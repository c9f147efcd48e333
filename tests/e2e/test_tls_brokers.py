"""A broker over TLS, as hosted brokers serve it: RabbitMQ at ``amqps://`` (Amazon MQ takes
nothing else, CloudAMQP's URLs are ``amqps://``), Redis at ``rediss://``, the provider's CA
trusted through Celery's ``broker_use_ssl`` in the deployment's settings module. A real
worker, beat and producers; every job succeeds, once. Before, ``amqps://`` was refused as a
broker scheme, and the worker's start check connected without ``broker_use_ssl``."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.support.env import service
from tests.support.procs import ROOT, finished, launching, ready, service_env
from tests.support.rounds import echo_round
from tests.support.servers import RedisServer

pytestmark = pytest.mark.timeout(180)

# Celery's broker_use_ssl: py-amqp takes ssl's own names, Redis's transport ssl_-prefixed ones.
TRUST = {
    "amqps": "{{'ca_certs': {ca!r}, 'cert_reqs': ssl.CERT_REQUIRED}}",
    "rediss": "{{'ssl_ca_certs': {ca!r}, 'ssl_cert_reqs': ssl.CERT_REQUIRED}}",
}


@pytest.fixture
def tls() -> Path:
    """scripts/services.sh's throwaway CA and its certificate for 127.0.0.1."""
    return Path(service("JOBSAPP_TEST_TLS_DIR"))


@pytest.fixture
def tls_redis(tls: Path, tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis-tls", dies_with_pytest=True, tls=tls)
    server.start()
    try:
        yield server
    finally:
        server.close()


def _env(
    postgres_url: str, broker_url: str, tmp_path: Path, counters: RedisServer
) -> dict[str, str]:
    return service_env(
        database_url=postgres_url,
        broker_url=broker_url,
        var_dir=tmp_path / "var",
        settings={
            "CELERY_CONFIG_MODULE": "deploy_settings",
            "PYTHONPATH": f"{ROOT}:{tmp_path}",
            "JOBSAPP_TEST_REDIS_URL": counters.url,  # the bodies' run counters
            "JOBSAPP_REDIS_URL": "",  # the optional dedup fast path: not under test here
        },
    )


def _trusting(tmp_path: Path, scheme: str, ca: Path) -> None:
    """The deployment's settings module, trusting the provider's CA."""
    trust = TRUST[scheme].format(ca=str(ca))
    (tmp_path / "deploy_settings.py").write_text(f"import ssl\nbroker_use_ssl = {trust}\n")


@pytest.mark.parametrize("scheme", ["amqps", "rediss"])
def test_a_broker_over_tls_carries_jobs_with_the_deployments_trust(
    scheme: str,
    pg: Engine,
    postgres_url: str,
    tls: Path,
    tls_redis: RedisServer,
    module_redis: RedisServer,
    tmp_path: Path,
) -> None:
    url = service("JOBSAPP_TEST_AMQPS_URL") if scheme == "amqps" else tls_redis.url
    _trusting(tmp_path, scheme, tls / "ca.crt")
    env = _env(postgres_url, url, tmp_path, module_redis)
    with launching(env, tmp_path) as launcher:
        ready(launcher.worker(f"{scheme}-{uuid.uuid4().hex[:6]}"), launcher.beat("beat"))
        echo_round(launcher, pg, module_redis)


def test_a_worker_that_does_not_trust_the_brokers_certificate_says_so_in_one_line(
    postgres_url: str, module_redis: RedisServer, tmp_path: Path
) -> None:
    (tmp_path / "deploy_settings.py").write_text("")  # the provider's CA not trusted
    env = _env(postgres_url, service("JOBSAPP_TEST_AMQPS_URL"), tmp_path, module_redis)
    worker = finished([sys.executable, "-m", "celery", "-A", "jobsapp", "worker"], env, tmp_path)
    last = worker.stderr.strip().splitlines()[-1]
    assert worker.returncode == 12, worker.stderr[-3000:]
    assert last.startswith("jobsapp: broker unreachable at JOBSAPP_BROKER_URL=amqps://"), last
    assert "CERTIFICATE_VERIFY_FAILED" in last, last
