"""Fixtures of the chaos suite: a fresh deployment per test, on real services.

Each test gets a Postgres database cloned from a template migrated once per session
(``CREATE DATABASE ... TEMPLATE``: a fresh, migrated schema in a fraction of a second), a
private ``redis-server`` (its broker and dedup store; killable without harming anyone),
and an S3 prefix of its own in the shared bucket. The RabbitMQ tests get a vhost of their
own. Every process a test starts is SIGKILLed (process group) by the finalizer.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.harness import (
    Broker,
    Cluster,
    PrivatePostgres,
    RabbitBroker,
    cluster_for,
    create_database,
    drop_database,
    migrate,
    private_pg_cluster,
)
from tests.support.env import SESSION, service
from tests.support.servers import RedisServer

TEMPLATE = f"jobsapp_chaos_tpl_{SESSION}"
_numbers = itertools.count(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-n",
        type=int,
        default=None,
        help="uploads per phase of the chaos soak (tests/chaos/test_soak.py; or JOBSAPP_SOAK_N)",
    )


def soak_requested(config: pytest.Config) -> bool:
    markexpr = config.getoption("-m") or ""
    asked = "soak" in markexpr and "not soak" not in markexpr
    sized = config.getoption("--soak-n", default=None) or os.environ.get("JOBSAPP_SOAK_N")
    return asked or bool(sized)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The big soak is deselected (not skipped) unless asked for; CI runs the quick one."""
    if soak_requested(config):
        return
    big = [item for item in items if item.get_closest_marker("soak")]
    if big:
        config.hook.pytest_deselected(items=big)
        items[:] = [item for item in items if not item.get_closest_marker("soak")]


@pytest.fixture(scope="session")
def template_db() -> Iterator[tuple[str, str]]:
    """(admin URL, template name): a database migrated by the real ``jobsapp db upgrade``."""
    admin = service("JOBSAPP_TEST_DATABASE_URL")
    url = create_database(admin, TEMPLATE)
    migrate(url)
    yield admin, TEMPLATE
    drop_database(admin, TEMPLATE)


@pytest.fixture
def database_url(template_db: tuple[str, str]) -> Iterator[str]:
    admin, template = template_db
    name = f"jobsapp_chaos_{SESSION}_{next(_numbers)}"
    url = create_database(admin, name, template)
    yield url
    drop_database(admin, name)


@pytest.fixture(params=["port"])
def redis_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisServer]:
    """The deployment's Redis, named by its port; a test may ask for its Unix socket too
    (``@pytest.mark.parametrize("redis_server", ["port", "socket"], indirect=True)``)."""
    server = RedisServer(tmp_path / "redis", by_socket=request.param == "socket")
    server.start()
    yield server
    server.close()


def _cluster(database_url: str, broker: Broker, workdir: Path) -> Iterator[Cluster]:
    bucket = service("JOBSAPP_TEST_S3_BUCKET")
    endpoint = service("JOBSAPP_TEST_S3_ENDPOINT_URL")
    prefix = f"chaos-{SESSION}-{uuid.uuid4().hex[:10]}"
    with cluster_for(
        prefix,
        database_url=database_url,
        broker=broker,
        storage_url=f"s3://{bucket}/{prefix}",
        s3_endpoint=endpoint,
        workdir=workdir,
    ) as cluster:
        yield cluster


@pytest.fixture
def cluster(database_url: str, redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    """A deployment on Redis (broker and dedup)."""
    yield from _cluster(database_url, redis_server, tmp_path)


@pytest.fixture
def amqp_cluster(database_url: str, redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    """A deployment on RabbitMQ with publisher confirms (Redis only for dedup)."""
    vhost = f"jobsapp-chaos-{SESSION}-{uuid.uuid4().hex[:8]}"
    broker = RabbitBroker.create(service("JOBSAPP_TEST_AMQP_URL"), redis_server.url, vhost)
    try:
        yield from _cluster(database_url, broker, tmp_path)
    finally:
        broker.close()


@pytest.fixture
def durable_cluster(
    durable_pg: PrivatePostgres, redis_server: RedisServer, tmp_path: Path
) -> Iterator[Cluster]:
    """A deployment on a Postgres the test may crash: each module that uses it defines
    ``durable_pg``, with the server settings its crash needs."""
    with private_pg_cluster(durable_pg, redis_server, tmp_path) as cluster:
        yield cluster
