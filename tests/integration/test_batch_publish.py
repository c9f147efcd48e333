"""A publish run in round trips of many messages (``outbox.publish``), on Redis and RabbitMQ.

The broker must hold every message the run accepted, whole and in the run's order, as a
plain Celery worker reads them; a broker that is down accepts none of them.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
import redis
from celery import Celery, signals
from kombu import Exchange, Queue

from jobsapp.db import utcnow
from jobsapp.lifecycle.journal import PendingMessage
from jobsapp.lifecycle.rules.message import build_body, task_id_for
from jobsapp.lifecycle.transport import batch_send, outbox, publisher
from tests.support.env import service
from tests.support.waiting import eventually

TRANSPORTS = {
    "redis": "jobsapp.lifecycle.transport.redis_transport:Transport",
    "amqp": "jobsapp.lifecycle.transport.amqp_transport:Transport",
}
# More than one round trip, and a last one that is not full.
COUNT = outbox.PIPELINE_MAX + 7


def _app(broker: str, url: str) -> Celery:
    app = Celery(f"batch-{broker}", broker=url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_send_sent_event=True,
        broker_transport=TRANSPORTS[broker],
        broker_transport_options={"confirm_publish": True},
        task_default_queue=f"batch-{uuid.uuid4().hex}",
    )
    return app


@contextmanager
def _owned_queue(broker: str) -> Iterator[Celery]:
    """An app of its own queue on the shared server (its name keeps the messages apart),
    the queue deleted after."""
    name = "JOBSAPP_TEST_REDIS_URL" if broker == "redis" else "JOBSAPP_TEST_AMQP_URL"
    app = _app(broker, service(name))
    try:
        yield app
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(app.conf.task_default_queue)
        app.close()


@pytest.fixture(params=list(TRANSPORTS))
def broker_app(request: pytest.FixtureRequest) -> Iterator[Celery]:
    with _owned_queue(request.param) as app:
        yield app


def _messages(count: int) -> list[PendingMessage]:
    now = utcnow()
    out = []
    for outbox_id in range(1, count + 1):
        job_id = uuid.uuid4()
        body = build_body(
            job_id=job_id, module="jobs", attempt=1, ids={"job_id": job_id}, enqueued_at=now
        )
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
    with _owned_queue("amqp") as app:
        name = app.conf.task_default_queue
        full = {"x-max-length": 2, "x-overflow": "reject-publish"}
        app.conf.task_queues = [Queue(name, queue_arguments=full)]
        report = outbox.publish(app, _messages(5))
        assert report.accepted == []
        assert "refused" in str(report.broker_error)
        assert len(_queued_task_ids(app)) == 2


def test_a_queue_rabbitmq_holds_with_other_arguments_refuses_a_run_in_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer that declares the queue otherwise than the broker holds it (a quorum queue
    configured in a module the producer does not import): RabbitMQ refuses each message's
    declare, each row is left to the relay, and the log says why once, naming the rows."""
    with _owned_queue("amqp") as app:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_declare(
                app.conf.task_default_queue,
                durable=True,
                auto_delete=False,
                arguments={"x-max-length": 9},
            )
        report = outbox.publish(app, _messages(3))
        assert report.accepted == []
        assert [row for row, _error in report.refused] == [1, 2, 3]
        lines = [r.getMessage() for r in caplog.records if r.name == outbox.__name__]
        assert len(lines) == 1, lines
        assert "outbox rows 1, 2, 3 refused" in lines[0]
        assert "PRECONDITION_FAILED" in lines[0]
        assert "x-max-length" in lines[0]


def test_a_queue_first_named_in_the_middle_of_a_batch_gets_its_messages(
    broker_app: Celery,
) -> None:
    """Its declare waits for the broker's answer while RabbitMQ's batch holds the frames of
    the messages before it (``amqp_transport``): those are written first, none is lost."""
    fresh = f"{broker_app.conf.task_default_queue}-fresh"
    messages = [replace(m, queue=fresh) if m.id > 3 else m for m in _messages(6)]
    try:
        report = outbox.publish(broker_app, messages)
        assert [a.id for a in report.accepted] == [m.id for m in messages]
        found = _take_queued(broker_app, [broker_app.conf.task_default_queue, fresh])
        assert set(found) == {task_id_for(m.job_id, 1) for m in messages}
    finally:
        with broker_app.connection_for_write() as conn:
            conn.default_channel.queue_delete(fresh)


# ------------------------------------ a batch sends what send_task sends for each job alone
# Per delivery, not per message: the broker's tag and counters, kombu's Redis delivery tag.
PER_DELIVERY = frozenset({"delivery_tag", "redelivered", "message_count", "consumer_tag"})
# Per event publish: the sender's logical clock and the time of sending.
PER_EVENT = frozenset({"clock", "timestamp"})


def _varied_app(broker: str, url: str) -> Celery:
    """The test app with a route to a second queue and a registered task with options of
    its own (its time limit travels in the headers), besides tasks only a worker knows."""
    app = _app(broker, url)
    other = f"{app.conf.task_default_queue}-other"
    app.conf.task_routes = {"tests.routed": {"queue": other}}
    app.task(name="tests.timed", time_limit=30, soft_time_limit=20, shared=False)(dict)
    app.finalize()
    return app


def _varied_messages(app: Celery) -> list[PendingMessage]:
    """First attempts and retries (which name their parent and root), a queue of the job's
    own, a priority and a time limit given as an int or a float, for registered, routed and
    unknown tasks: most combinations more than once, first attempts and retries among them
    (a batch copies a shape's first message)."""
    other = app.amqp.router.route({}, "tests.routed")["queue"].name
    names = ("tests.echo", "tests.timed", "tests.routed")
    now = utcnow()
    out = []
    for outbox_id in range(1, 37):
        job_id, attempt = uuid.uuid4(), 1 + (outbox_id // 12) % 2
        # A time limit is sent as given: 30 and 30.0 are different messages.
        limit = 30 if (outbox_id // 6) % 2 else 30.0
        body = build_body(
            job_id=job_id,
            module="jobs",
            attempt=attempt,
            ids={"job_id": job_id},
            enqueued_at=now,
            limits={"soft_time_limit": limit},
        )
        out.append(
            PendingMessage(
                outbox_id,
                job_id,
                attempt,
                names[outbox_id % 3],
                body,
                now,
                queue=other if outbox_id % 4 == 0 else None,
                priority=5 if outbox_id % 2 else None,
            )
        )
    return out


def _wire(message: Any) -> dict[str, Any]:
    """A queued message as a consumer reads it, less what each delivery adds; its headers
    and properties as JSON text, so that 30 and 30.0 (equal in Python) differ here."""
    properties = {k: v for k, v in message.properties.items() if k not in PER_DELIVERY}
    if isinstance(properties.get("delivery_info"), dict):
        properties["delivery_info"] = {
            k: v for k, v in properties["delivery_info"].items() if k not in PER_DELIVERY
        }
    info = message.delivery_info
    return {
        "headers": json.dumps(message.headers, sort_keys=True, default=repr),
        "properties": json.dumps(properties, sort_keys=True, default=repr),
        "body": message.body,
        "content": (message.content_type, message.content_encoding),
        "routing": (info["exchange"], info["routing_key"]),
    }


def _take_queued(app: Celery, queues: list[str]) -> dict[str, dict[str, Any]]:
    """Every message of ``queues``, taken, by task id."""
    found = {}
    with app.connection_for_write() as conn:
        for name in queues:
            queue = Queue(name).bind(conn.default_channel)
            while (message := queue.get(no_ack=True)) is not None:
                found[message.headers["id"]] = _wire(message)
    return found


@contextmanager
def _task_sent_events(app: Celery, broker: str) -> Iterator[Callable[[set[str]], dict[str, Any]]]:
    """Listening to the task-sent events from the start; yields ``take(ids)``: the events
    of those task ids (the broker's event exchange also carries other tests' events), by
    task id, less what each publish of an event stamps on it."""
    listening = _redis_events(app) if broker == "redis" else _amqp_events(app)
    with listening as read:
        seen: dict[str, Any] = {}

        def take(ids: set[str]) -> dict[str, Any]:
            def arrived() -> bool:
                for event in read():
                    if event["uuid"] in ids:
                        seen[event["uuid"]] = {k: v for k, v in event.items() if k not in PER_EVENT}
                return len(seen) >= len(ids)

            eventually(arrived, timeout=20)
            return dict(seen)

        yield take


def _taken_apart(body: Any) -> list[dict[str, Any]]:
    """An event message's events, as Celery's receiver takes them: one, or a list of them
    (``task.multi``, as a worker sends its task events and a batch its task-sent ones)."""
    return body if isinstance(body, list) else [body]


@contextmanager
def _redis_events(app: Celery) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    # kombu publishes Redis fanout messages with PUBLISH: only a subscriber sees them.
    client = redis.Redis.from_url(app.conf.broker_url)
    pubsub = client.pubsub()
    pubsub.psubscribe(f"*{app.conf.event_exchange}*")
    eventually(lambda: pubsub.get_message(timeout=1), timeout=10)  # the subscription

    def read() -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        while (item := pubsub.get_message(timeout=0.2)) is not None:
            frame = json.loads(item["data"])
            events.extend(_taken_apart(json.loads(base64.b64decode(frame["body"]))))
        return events

    try:
        yield read
    finally:
        pubsub.close()
        client.close()


@contextmanager
def _amqp_events(app: Celery) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    with app.connection_for_write() as conn:
        exchange = Exchange(app.conf.event_exchange, type="topic")
        queue = Queue(f"{app.conf.task_default_queue}-events", exchange, routing_key="task.#").bind(
            conn.default_channel
        )
        queue.declare()

        def read() -> list[dict[str, Any]]:
            events: list[dict[str, Any]] = []
            while (message := queue.get(no_ack=True)) is not None:
                events.extend(_taken_apart(message.decode()))
            return events

        try:
            yield read
        finally:
            queue.delete()


def _published(
    app: Celery, broker: str, messages: list[PendingMessage], *, batch: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The queued messages and task-sent events of publishing ``messages`` in one batch,
    or each in a publish run of its own (``send_task`` per message)."""
    queues = [app.conf.task_default_queue, f"{app.conf.task_default_queue}-other"]
    with _task_sent_events(app, broker) as take_events:
        runs = [messages] if batch else [[m] for m in messages]
        for run in runs:
            assert len(outbox.publish(app, run).accepted) == len(run)
        events = take_events({task_id_for(m.job_id, m.attempt) for m in messages})
    return _take_queued(app, queues), events


@pytest.mark.parametrize("broker", list(TRANSPORTS))
def test_a_batch_sends_what_each_job_alone_sends(broker: str) -> None:
    """The same messages; the same task-sent events, a batch's in Celery's lists."""
    url = service("JOBSAPP_TEST_REDIS_URL" if broker == "redis" else "JOBSAPP_TEST_AMQP_URL")
    app = _varied_app(broker, url)
    messages = _varied_messages(app)
    try:
        one_by_one = _published(app, broker, messages, batch=False)
        batched = _published(app, broker, messages, batch=True)
    finally:
        with app.connection_for_write() as conn:
            for name in (app.conf.task_default_queue, f"{app.conf.task_default_queue}-other"):
                conn.default_channel.queue_delete(name)
        app.close()
    ids = {task_id_for(m.job_id, m.attempt) for m in messages}
    assert set(one_by_one[0]) == ids
    assert batched[0] == one_by_one[0]
    assert set(one_by_one[1]) == ids
    assert batched[1] == one_by_one[1]


def test_a_batch_sends_its_task_sent_events_in_lists_as_a_worker_sends_its_own() -> None:
    """30 messages, 2 event messages (Celery's default list of 24, then 6), in order."""
    app = _app("redis", service("JOBSAPP_TEST_REDIS_URL"))
    messages = _messages(30)
    client = redis.Redis.from_url(app.conf.broker_url)
    pubsub = client.pubsub()
    pubsub.psubscribe(f"*{app.conf.event_exchange}*")
    eventually(lambda: pubsub.get_message(timeout=1), timeout=10)  # the subscription
    try:
        assert len(outbox.publish(app, messages).accepted) == 30
        frames: list[Any] = []

        def arrived() -> bool:
            while (item := pubsub.get_message(timeout=0.2)) is not None:
                frames.append(json.loads(base64.b64decode(json.loads(item["data"])["body"])))
            return sum(len(f) for f in frames) >= 30

        eventually(arrived, timeout=20)
    finally:
        pubsub.close()
        client.close()
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(app.conf.task_default_queue)
        app.close()
    assert [len(f) for f in frames] == [24, 6]
    sent = [event["uuid"] for frame in frames for event in frame]
    assert sent == [task_id_for(m.job_id, 1) for m in messages]
    assert {event["type"] for frame in frames for event in frame} == {"task-sent"}


def test_a_publish_signal_sees_and_may_change_every_message_of_a_batch() -> None:
    """Celery's idiom: a ``before_task_publish`` receiver that adds a header. With one
    connected, every message of a batch is Celery's own (no copy of a shape's first)."""
    app = _app("redis", service("JOBSAPP_TEST_REDIS_URL"))
    messages = _messages(6)  # one shape
    seen: list[str] = []

    def tag(headers: dict[str, Any], **_: Any) -> None:
        seen.append(headers["id"])
        headers["tenant"] = f"t-{len(seen)}"

    signals.before_task_publish.connect(tag)
    try:
        assert len(outbox.publish(app, messages).accepted) == 6
        queued = _take_queued(app, [app.conf.task_default_queue])
    finally:
        signals.before_task_publish.disconnect(tag)
        app.close()
    ids = [task_id_for(m.job_id, 1) for m in messages]
    assert seen == ids
    tenants = {task_id: json.loads(wire["headers"])["tenant"] for task_id, wire in queued.items()}
    assert tenants == {task_id: f"t-{n}" for n, task_id in enumerate(ids, 1)}


def test_a_batch_message_with_an_option_that_has_no_hash_is_sent_as_send_task_sends_it() -> None:
    """Celery's stamping options are lists (``stamped_headers``): such a message has no
    shape to copy and goes through Celery whole, stamps and all."""
    app = _app("redis", service("JOBSAPP_TEST_REDIS_URL"))
    task_ids = [str(uuid.uuid4()) for _ in range(3)]
    try:
        with publisher.producer(app) as producer, publisher.batch(producer, 10):
            sender = batch_send.BatchSender(app, producer)
            for n, task_id in enumerate(task_ids):
                sender.send_task(
                    "tests.echo",
                    args=(n,),
                    kwargs={},
                    task_id=task_id,
                    argsrepr=f"({n},)",
                    kwargsrepr="{}",
                    stamped_headers=["tenant"],
                    tenant=f"t-{n}",
                )
            sender.flush_events()
        queued = _take_queued(app, [app.conf.task_default_queue])
    finally:
        app.close()
    stamps = {task_id: json.loads(wire["headers"])["stamps"] for task_id, wire in queued.items()}
    assert stamps == {task_id: {"tenant": f"t-{n}"} for n, task_id in enumerate(task_ids)}
