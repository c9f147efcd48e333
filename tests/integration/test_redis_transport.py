"""jobsapp's kombu Redis transport against the real Redis: one client per channel."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from jobsapp.lifecycle.transport import publisher
from tests.support.env import SESSION, service

QUEUE = f"jobsapp-transport-{SESSION}"


@pytest.fixture
def app() -> Iterator[Celery]:
    """A producer app on jobsapp's transport, publishing to a queue of this session."""
    app = Celery("transport-tests", set_as_current=False)
    app.conf.update(
        broker_url=service("JOBSAPP_TEST_REDIS_URL"),
        task_default_queue=QUEUE,
        broker_transport="jobsapp.lifecycle.transport.redis_transport:Transport",
    )
    client = redis.Redis.from_url(service("JOBSAPP_TEST_REDIS_URL"))
    client.delete(QUEUE)
    yield app
    client.delete(QUEUE)
    client.close()
    app.close()


@pytest.fixture
def constructions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per ``redis.Redis`` built in this process from now on."""
    built: list[int] = []
    original = redis.Redis.__init__

    def counting(self: redis.Redis, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", counting)
    return built


def _send(app: Celery, count: int) -> None:
    with publisher.producer(app) as producer:
        for i in range(count):
            app.send_task("tests.echo", kwargs={"token": str(i)}, producer=producer, retry=False)


def test_publishes_share_one_redis_client(app: Celery, constructions: list[int]) -> None:
    _send(app, 1)  # the channel and its client are made here
    constructions.clear()
    _send(app, 20)
    assert constructions == []
    assert redis.Redis.from_url(service("JOBSAPP_TEST_REDIS_URL")).llen(QUEUE) == 21


def test_a_connection_the_server_dropped_is_replaced(app: Celery) -> None:
    _send(app, 1)
    admin = redis.Redis.from_url(service("JOBSAPP_TEST_REDIS_URL"))
    with publisher.producer(app) as producer:
        with producer.channel.conn_or_acquire() as client:
            pooled = client.client_id()  # the pooled connection the next publish takes
        assert admin.client_kill_filter(_id=pooled) == 1
        app.send_task("tests.echo", kwargs={"token": "after"}, producer=producer, retry=False)
    assert admin.llen(QUEUE) == 2
    admin.close()
