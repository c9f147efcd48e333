"""The queues page's broker column (``monitor.queues.broker_depths``): each queue as the
broker counts it, on Redis and on RabbitMQ, read on the process's pooled publish
connection (``publisher.declared``), so that a page load opens no broker connection."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from jobsapp.celery_app import create_app
from jobsapp.monitor.queues import BrokerDepth, broker_depths
from jobsapp.settings import get_settings
from tests.support.env import service
from tests.support.servers import closed_port
from tests.support.waiting import eventually

URLS = {"redis": "JOBSAPP_TEST_REDIS_URL", "amqp": "JOBSAPP_TEST_AMQP_URL"}


def _app(url: str, monkeypatch: pytest.MonkeyPatch) -> Celery:
    """jobsapp's app on ``url``, as the web process builds it."""
    monkeypatch.setenv("JOBSAPP_BROKER_URL", url)
    get_settings.cache_clear()
    return create_app()


@pytest.fixture(params=list(URLS))
def on_broker(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Celery, str]]:
    """(broker kind, jobsapp's app on it, a queue holding 3 messages), the queue deleted after."""
    url = service(URLS[request.param])
    queue = f"depths-{uuid.uuid4().hex}"
    sender = Celery("depths-sender", broker=url)
    for _ in range(3):
        sender.send_task("tests.depths.never_run", queue=queue)
    app = _app(url, monkeypatch)
    yield request.param, app, queue
    with sender.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)
    sender.close()
    app.close()
    get_settings.cache_clear()


def test_each_queue_shows_its_messages_and_an_unknown_queue_says_so(
    on_broker: tuple[str, Celery, str],
) -> None:
    kind, app, queue = on_broker
    unknown = f"depths-unknown-{uuid.uuid4().hex}"

    shown = eventually(lambda: _when(broker_depths(app, [queue, unknown]), queue, 3))

    if kind == "redis":  # an empty queue is no key at all: nothing waits in it
        assert shown == {queue: BrokerDepth(3, None), unknown: BrokerDepth(0, None)}
    else:
        assert shown == {
            queue: BrokerDepth(3, 0),
            unknown: BrokerDepth(None, None, "not declared on the broker"),
        }
    # RabbitMQ closed the channel that asked for the unknown queue, not the connection.
    assert broker_depths(app, [queue]) == {queue: shown[queue]}


def _when(found: dict[str, BrokerDepth], queue: str, messages: int) -> Any:
    return found if found[queue].messages == messages else None


def test_a_page_load_opens_no_broker_connection_of_its_own(
    on_broker: tuple[str, Celery, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, app, queue = on_broker
    broker_depths(app, [queue])  # the process's first publish connection
    connects: list[Any] = []
    real, mine = socket.socket.connect, threading.get_ident()

    def counted(sock: socket.socket, address: Any) -> None:
        # This thread's: another test's thread in this process may connect meanwhile.
        if threading.get_ident() == mine:
            connects.append(address)
        real(sock, address)

    monkeypatch.setattr(socket.socket, "connect", counted)

    for _ in range(5):
        assert broker_depths(app, [queue, "another"])[queue].messages == 3

    assert connects == []


def test_a_broker_that_is_down_is_a_cell_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    app = _app(f"redis://127.0.0.1:{closed_port()}/0", monkeypatch)
    try:
        found = broker_depths(app, ["celery", "other"])
    finally:
        app.close()
        get_settings.cache_clear()
    down = BrokerDepth(None, None, "broker unavailable")
    assert found == {"celery": down, "other": down}
