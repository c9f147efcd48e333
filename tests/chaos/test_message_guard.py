"""No message stops a worker, on Redis and on RabbitMQ.

A real ``celery -A jobsapp worker`` per broker receives raw kombu messages whose headers,
body, content type or encoding are broken: the three that used to stop it for good (no
``id``; a ``task`` that is a list; a ``timelimit`` that is a string), then a stream of
mutations of a valid message drawn by hypothesis. Each must be rejected once with a log
line naming the reason (on RabbitMQ: dead-lettered), and a normal job behind them must
still complete on the same, never restarted, worker.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from jobsapp.lifecycle.transport.guard import DEAD_LETTERS
from tests.chaos.harness import (
    QUEUE,
    Broker,
    Cluster,
    RabbitBroker,
    _rabbitmqctl,
    cluster_for,
    create_database,
    drop_database,
)
from tests.chaos.messages import (
    ECHO,
    HEADER_FAULTS,
    Raw,
    Sender,
    faulty,
    proto2_body,
    proto2_headers,
    run_echo,
    start_worker,
    valid_body,
)
from tests.support.env import SESSION, service
from tests.support.procs import Proc
from tests.support.servers import RedisServer

pytestmark = pytest.mark.timeout(240)

# A task a foreign producer may call with a bare valid body: the base of every mutant.
TICK = "tests.tick"
# Signs of a consumer that died or reconnected: the faults this module is about.
BROKEN = ("Unrecoverable error", "Connection to broker lost", "Restoring", "CRITICAL")
# A message not refused within this time after its successor completed never will be.
SETTLE_S = 2.0


@dataclass
class Guarded:
    cluster: Cluster
    broker: Broker
    worker: Proc
    sender: Sender
    kind: str

    def rejections(self, task_id: str) -> list[str]:
        return re.findall(rf"rejected message {re.escape(task_id)} for (.*)", self.worker.log())

    def dead_letters(self) -> int:
        """Messages in the dead-letter queue; none while the worker has not declared it."""
        from amqp.exceptions import NotFound
        from kombu import Connection

        with Connection(self.broker.url, connect_timeout=5) as conn:
            try:
                _, count, _ = DEAD_LETTERS.bind(conn.default_channel).queue_declare(passive=True)
            except NotFound:
                return 0
        return int(count)

    def assert_serving(self, token: str) -> None:
        row = run_echo(self.cluster, token, timeout=45)
        assert row["state"] == "succeeded", row
        log = self.worker.log()
        assert self.worker.alive(), log[-3000:]
        assert [b for b in BROKEN if b in log] == [], log[-3000:]


def _with_dead_letter_policy(broker: RabbitBroker) -> None:
    """What docs/reliability.md asks operators to set: rejected task messages go to the
    worker-declared ``jobsapp.dead`` exchange."""
    policy = json.dumps({"dead-letter-exchange": DEAD_LETTERS.exchange.name})
    argv = (
        "set_policy",
        "-p",
        broker.vhost,
        "jobsapp-dead-letters",
        f"^{QUEUE}$",
        policy,
        "--apply-to",
        "queues",
    )
    refused = _rabbitmqctl(*argv)
    assert refused is None, f"rabbitmqctl set_policy failed: {refused}"


@pytest.fixture(scope="module", params=["redis", "amqp"])
def guarded(
    request: pytest.FixtureRequest,
    template_db: tuple[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Guarded]:
    """One long-lived worker on a database, a broker and an S3 prefix of its own."""
    kind = request.param
    admin, template = template_db
    name = f"jobsapp_chaos_{SESSION}_guard_{kind}"
    url = create_database(admin, name, template)
    workdir = tmp_path_factory.mktemp(f"guard-{kind}")
    redis = RedisServer(workdir / "redis")
    redis.start()
    broker: Broker = redis
    if kind == "amqp":
        vhost = f"jobsapp-guard-{SESSION}-{uuid.uuid4().hex[:8]}"
        broker = rabbit = RabbitBroker.create(service("JOBSAPP_TEST_AMQP_URL"), redis.url, vhost)
        _with_dead_letter_policy(rabbit)
    bucket = service("JOBSAPP_TEST_S3_BUCKET")
    prefix = f"chaos-guard-{SESSION}-{uuid.uuid4().hex[:8]}"
    try:
        with cluster_for(
            prefix,
            database_url=url,
            broker=broker,
            storage_url=f"s3://{bucket}/{prefix}",
            s3_endpoint=service("JOBSAPP_TEST_S3_ENDPOINT_URL"),
            workdir=workdir,
        ) as cluster:
            worker = start_worker(cluster, broker, f"guard-{kind}")
            yield Guarded(cluster, broker, worker, Sender(broker.url, workdir), kind)
    finally:
        if isinstance(broker, RabbitBroker):
            broker.close()
        redis.close()
        drop_database(admin, name)


# ------------------------------------------------------------- the three named faults


@pytest.mark.parametrize("fault", list(HEADER_FAULTS))
def test_a_bad_header_is_rejected_once_and_the_next_job_runs(guarded: Guarded, fault: str) -> None:
    changes, reason = HEADER_FAULTS[fault]
    task_id, raw = faulty(changes)
    # A message with no id is named "<no id>" in its line: count those lines before and after.
    named = re.escape(task_id if "id" in raw.headers else "<no id>")
    line = rf"rejected message {named} for [^:]*: {reason}"
    before = len(re.findall(line, guarded.worker.log()))
    dead_before = guarded.dead_letters() if guarded.kind == "amqp" else 0
    guarded.sender.publish_raw([raw])
    guarded.assert_serving(f"after {fault}")
    time.sleep(SETTLE_S)
    log = guarded.worker.log()
    assert len(re.findall(line, log)) == before + 1, log[-3000:]
    assert f"[{task_id}] received" not in log, "a refused message reached the task"
    assert guarded.broker.pending() == 0
    if guarded.kind == "amqp":
        # The policy routes the reject to the dead-letter queue the worker declared.
        assert guarded.dead_letters() == dead_before + 1
    else:
        assert isinstance(guarded.broker, RedisServer)
        assert guarded.broker.unacked() == 0


# ------------------------------------------------------------------- mutations

JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**31), 2**31),
    st.text(max_size=12),
    st.floats(allow_nan=False, allow_infinity=False),
)
JSON = st.recursive(
    JSON_LEAF,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
HEADER_NAMES = st.sampled_from(
    [
        *sorted(proto2_headers(ECHO, "x")),
        "stamps",
        "stamped_headers",
        "group_index",
        "replaced_task_nesting",
        "compression",
    ]
)
CONTENT = st.sampled_from(
    [
        ("application/json", "utf-8"),
        ("application/json", "binary"),
        ("application/json", "utf-16"),
        ("application/x-yaml", "utf-8"),
        ("application/x-python-serialize", "binary"),
        ("application/x-msgpack", "binary"),
        ("text/plain", "utf-8"),
        ("", ""),
        ("application/json", "no-such-codec"),
    ]
)


# Found by random runs: the body replaced by a list shorter than protocol 2's three parts;
# a compression header naming no codec (kombu fails the message before any handler).
SHORT_BODY = Raw(proto2_headers(TICK, str(uuid.uuid4())), [{"": None}])
NO_CODEC = Raw(
    {**proto2_headers(TICK, str(uuid.uuid4())), "compression": 13920243},
    proto2_body(valid_body()),
    "application/x-msgpack",
    "binary",
)


@st.composite
def mutated(draw: st.DrawFn) -> Raw:
    """A valid foreign message with one to three faults in its headers, body or format."""
    raw = Raw(proto2_headers(TICK, str(uuid.uuid4())), proto2_body(valid_body()))
    for _ in range(draw(st.integers(1, 3))):
        part = draw(st.sampled_from(["drop header", "set header", "body", "body part", "format"]))
        if part == "drop header":
            raw.headers.pop(draw(HEADER_NAMES), None)
        elif part == "set header":
            raw.headers[draw(HEADER_NAMES)] = draw(JSON)
        elif part == "body":
            raw.body = draw(JSON | st.binary(max_size=20))
        elif part == "body part" and isinstance(raw.body, list) and raw.body:
            # The body may already be a shorter list drawn by "body".
            raw.body[draw(st.integers(0, len(raw.body) - 1))] = draw(JSON)
        else:
            raw.content_type, raw.content_encoding = draw(CONTENT)
    return raw


def test_mutated_messages_never_stop_the_worker(guarded: Guarded) -> None:
    sent: list[Raw] = []
    refused_before = guarded.worker.log().count("rejected message ")
    dead_before = guarded.dead_letters() if guarded.kind == "amqp" else 0

    @settings(
        max_examples=120, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(mutated())
    @example(SHORT_BODY)
    @example(NO_CODEC)
    def send(raw: Raw) -> None:
        guarded.sender.publish_raw([raw])
        sent.append(raw)

    send()
    guarded.assert_serving("after the mutants")
    time.sleep(SETTLE_S)
    log = guarded.worker.log()
    for raw in sent:
        task_id = raw.headers.get("id")
        if isinstance(task_id, str) and task_id:
            refused, received = len(guarded.rejections(task_id)), log.count(f"[{task_id}] received")
            assert refused + received >= 1, f"never handled: {raw}"
            assert refused <= 1, f"refused twice: {raw}"
            assert received <= 1, f"delivered twice: {raw}"
    assert guarded.broker.pending() == 0
    if guarded.kind == "amqp":
        # Every refusal, the guard's and the tasks', was dead-lettered, and only those.
        refused = log.count("rejected message ") - refused_before
        assert guarded.dead_letters() - dead_before == refused > 0
    guarded.assert_serving("still serving")


# ------------------------------------------------------------- Redis list items

GOOD_FRAME: dict[str, Any] = {
    "body": "W10=",
    "content-encoding": "utf-8",
    "content-type": "application/json",
    "headers": {},
    "properties": {
        "delivery_tag": "t",
        "body_encoding": "base64",
        "priority": 0,
        "delivery_info": {"exchange": QUEUE, "routing_key": QUEUE},
    },
}


def _frame(**changes: Any) -> bytes:
    properties = {**GOOD_FRAME["properties"], **changes.pop("properties", {})}
    return json.dumps({**GOOD_FRAME, "properties": properties, **changes}).encode()


UNREADABLE = [
    b"not json at all",
    b"\xff\xfe\x00",
    b"[]",
    b"{}",
    json.dumps({**GOOD_FRAME, "properties": {}}).encode(),
    _frame(properties={"body_encoding": "rot13"}),
    _frame(properties={"delivery_info": None}),
    _frame(body={"not": "text"}),
]
# A frame kombu can read (the body decodes to nothing): the message guard refuses it.
HEADERLESS = _frame(body="%%%")


@pytest.mark.parametrize("redis_server", ["port", "socket"], indirect=True)
def test_a_redis_item_that_is_no_kombu_message_is_refused(cluster: Cluster) -> None:
    """Pushed on the list by something that is not kombu: kombu used to choke on it
    inside the event loop, before any consumer code ran. By port (``redis://``) or by
    Unix socket (``redis+socket://``, which got kombu's own transport)."""
    assert isinstance(cluster.broker, RedisServer)
    worker = start_worker(cluster, cluster.broker, "frames")
    with contextlib.closing(cluster.broker.client()) as client:
        client.lpush(QUEUE, *UNREADABLE, HEADERLESS)
    guarded = Guarded(cluster, cluster.broker, worker, Sender(cluster.broker.url, Path()), "redis")
    guarded.assert_serving("after the unreadable items")
    log = worker.log()
    assert log.count("rejected message <unreadable> for <no task>: ") == len(UNREADABLE), log[
        -3000:
    ]
    assert log.count("rejected message <no id> for <no task>: no task header") == 1
    assert cluster.broker.pending() == 0
    assert cluster.broker.unacked() == 0


def test_a_worker_that_cannot_declare_its_dead_letter_queue_still_serves(
    amqp_cluster: Cluster,
) -> None:
    """A queue of that name with other arguments makes RabbitMQ refuse the declare."""
    from kombu import Connection, Queue

    with Connection(amqp_cluster.broker.url, connect_timeout=5) as conn:
        Queue(DEAD_LETTERS.name, durable=False).bind(conn.default_channel).declare()
    worker = start_worker(amqp_cluster, amqp_cluster.broker, "no-dead-letters")
    guarded = Guarded(amqp_cluster, amqp_cluster.broker, worker, Sender("", Path()), "amqp")
    guarded.assert_serving("without dead letters")
    assert "dead-letter queue jobsapp.dead not declared: " in worker.log()
