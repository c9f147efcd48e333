"""A publish run in round trips of many messages (``outbox.publish``), on Redis and RabbitMQ.

The broker must hold every message the run accepted, whole and in the run's order, as a
plain Celery worker reads them; a broker that is down accepts none of them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from celery import Celery
from kombu import Queue

from jobsapp.db import utcnow
from jobsapp.lifecycle import outbox
from jobsapp.lifecycle.journal import PendingMessage
from jobsapp.lifecycle.message import build_body, task_id_for
from tests.support.env import service

TRANSPORTS = {"redis": "jobsapp.lifecycle.redis_transport:Transport",
              "amqp": "jobsapp.lifecycle.amqp_transport:Transport"}  # fmt: skip
# More than one round trip, and a last one that is not full.
COUNT = outbox.PIPELINE_MAX + 7


def _app(broker: str, url: str) -> Celery:
    app = Celery(f"batch-{broker}", broker=url, set_as_current=False)
    app.conf.update(task_serializer="json", accept_content=["json"],
                    task_send_sent_event=True, broker_transport=TRANSPORTS[broker],
                    broker_transport_options={"confirm_publish": True},
                    task_default_queue=f"batch-{uuid.uuid4().hex}")  # fmt: skip
    return app


@pytest.fixture(params=list(TRANSPORTS))
def broker_app(request: pytest.FixtureRequest) -> Iterator[Celery]:
    # The shared servers: the queue's own name keeps this test's messages apart.
    name = "JOBSAPP_TEST_REDIS_URL" if request.param == "redis" else "JOBSAPP_TEST_AMQP_URL"
    url = service(name)
    app = _app(request.param, url)
    yield app
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(app.conf.task_default_queue)
    app.close()


def _messages(count: int) -> list[PendingMessage]:
    now = utcnow()
    out = []
    for outbox_id in range(1, count + 1):
        job_id = uuid.uuid4()
        body = build_body(job_id=job_id, module="jobs", attempt=1, ids={"job_id": job_id},
                          enqueued_at=now)  # fmt: skip
        out.append(PendingMessage(outbox_id, job_id, 1, "tests.echo", body, now))
    return out


def _queued_task_ids(app: Celery) -> list[str]:
    """Every message in the app's queue, taken in delivery order, as Celery reads it."""
    ids = []
    with app.connection_for_write() as conn:
        queue = Queue(app.conf.task_default_queue).bind(conn.default_channel)
        while (message := queue.get(no_ack=True)) is not None:
            assert message.headers["task"] == "tests.echo"
            assert message.decode()[1]["outbox_id"] == len(ids) + 1
            ids.append(message.headers["id"])
    return ids


def test_every_accepted_message_of_a_batch_is_in_the_queue_in_order(broker_app: Celery) -> None:
    messages = _messages(COUNT)
    report = outbox.publish(broker_app, messages)
    assert report.broker_error is None
    assert [a.id for a in report.accepted] == [m.id for m in messages]
    assert _queued_task_ids(broker_app) == [task_id_for(m.job_id, 1) for m in messages]


def test_a_broker_that_is_down_accepts_none_of_a_batch() -> None:
    for broker, url in (("redis", "redis://127.0.0.1:1/0"), ("amqp", "pyamqp://127.0.0.1:1//")):
        report = outbox.publish(_app(broker, url), _messages(3))
        assert report.accepted == [], broker
        assert report.broker_error is not None, broker


def test_a_batch_rabbitmq_refuses_in_part_is_accepted_in_none() -> None:
    """A full queue that rejects publishes: RabbitMQ nacks the batch's last messages after
    confirming the first, and the run accepts none (which ones arrived is not told apart;
    the relay sends them all again and the claim absorbs the copies)."""
    app = _app("amqp", service("JOBSAPP_TEST_AMQP_URL"))
    name = app.conf.task_default_queue
    full = {"x-max-length": 2, "x-overflow": "reject-publish"}
    app.conf.task_queues = [Queue(name, queue_arguments=full)]
    try:
        report = outbox.publish(app, _messages(5))
        assert report.accepted == []
        assert "refused" in str(report.broker_error)
        assert len(_queued_task_ids(app)) == 2
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(name)
        app.close()
