"""Hostile and broken broker messages against a real ``celery -A jobsapp worker``.

A producer that is not jobsapp (a bug, an old deployment, an attacker with broker access)
puts messages on the ``celery`` queue: schema violations, ids that are URLs or paths,
attempts below one, a megabyte of kwargs, pickle, bodies that are not JSON, task names
nobody registered, and a well-formed foreign message for an attachment that does not
exist. Each must be refused with one log line naming it, change nothing in the journal
or the bucket, never come back (no redelivery loop), and leave the worker serving.

The worker is a real subprocess on a private ``redis-server`` (its broker), its own
Postgres database and its own S3 prefix (``tests.chaos.harness``); messages are sent
with kombu's ``Producer.publish`` (Celery protocol 2 headers built here) and with
``send_task`` of a bare Celery app, never through jobsapp's producer.
"""

from __future__ import annotations

import pickle
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from jobsapp.attachments.models import ATTACHMENTS, RUNS
from jobsapp.attachments.tasks import TASK_NAME as ATTACHMENT_TASK
from jobsapp.lifecycle.journal import EVENTS, OUTBOX
from tests.chaos.harness import (
    Cluster,
    cluster_for,
    create_database,
    drop_database,
)
from tests.chaos.messages import (
    DROP,
    JOB_RUNS,
    Sender,
    proto2_body,
    run_echo,
    start_worker,
    valid_body,
)
from tests.support.env import SESSION, service
from tests.support.procs import Proc
from tests.support.servers import RedisServer

pytestmark = pytest.mark.timeout(120)

# How long a refused message has to come back before we call it gone for good.
SETTLE_S = 3.0


class PickleCanary:
    """Unpickling this creates the canary file: proof that nobody deserialised it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.path,))


# -------------------------------------------------------------------------- cases

# {tag} is what identifies the message in the log: its task id.
REJECTED = r"rejected message {tag} for {task}: "


@dataclass(frozen=True)
class Case:
    """One hostile message: how to send it (returns its tag), and the one log line that
    must refuse it."""

    name: str
    send: Callable[[Sender], str]
    expect: str  # a regex over the worker's log; {tag} and {task} are filled in
    task: str = "tests.echo"
    job_id: str | None = None
    reaches_task: bool = True  # the worker hands it to the task, which refuses it

    def pattern(self, tag: str) -> str:
        return self.expect.replace("{tag}", re.escape(tag)).replace("{task}", re.escape(self.task))


def _schema(name: str, reason: str, body: dict[str, Any], task: str = "tests.echo") -> Case:
    job_id = body.get("job_id")
    return Case(
        name,
        lambda s: s.send_task(task, body),
        REJECTED + reason,
        task,
        job_id if isinstance(job_id, str) else None,
    )


def _marked(name: str, content_type: str, expect: str) -> Case:
    """A body kombu must refuse before parsing: a well-formed one, in a refused format."""

    def send(sender: Sender) -> str:
        return sender.publish("tests.echo", b'[[], {"marker": "m"}, {}]', content_type=content_type)

    return Case(name, send, expect, reaches_task=False)


def _pickle(sender: Sender) -> str:
    """A pickle whose loading would create a canary file."""
    payload = pickle.dumps(PickleCanary(sender.canary / uuid.uuid4().hex))
    return sender.publish(
        "tests.echo",
        payload,
        content_type="application/x-python-serialize",
        content_encoding="binary",
    )


def _not_json(sender: Sender) -> str:
    return sender.publish("tests.echo", b"{this is not json")


def _unknown_task(sender: Sender) -> str:
    return sender.publish("tests.no_such_task", proto2_body(valid_body()))


def _positional(sender: Sender) -> str:
    """A plain Celery call becomes a run only when its arguments fit the body."""
    return sender.send_task("tests.echo", {}, args=("http://x", "y"))


UNDECODABLE = REJECTED + r"body cannot be decoded: "
UNTRUSTED = UNDECODABLE + r"ContentDisallowed: Refusing to deserialize untrusted content"
BIG = "x" * (1024 * 1024)
CASES: list[Case] = [
    _schema(
        "extra field",
        r"schema violation at \(root\): Additional properties",
        valid_body(url="http://x/payload"),
    ),
    _schema(
        "missing job_id",
        r"schema violation at \(root\): 'job_id' is a required",
        valid_body(job_id=DROP),
    ),
    _schema("job_id not a uuid", r"schema violation at job_id", valid_body(job_id="not-a-uuid")),
    _schema("job_id is a URL", r"schema violation at job_id", valid_body(job_id="http://x")),
    _schema("attempt zero", r"schema violation at attempt", valid_body(attempt=0)),
    _schema("attempt negative", r"schema violation at attempt", valid_body(attempt=-3)),
    _schema("attempt a float", r"field attempt must be an integer", valid_body(attempt=1.0)),
    _schema("attempt a string", r"schema violation at attempt", valid_body(attempt="1")),
    _schema("module is a path", r"schema violation at module", valid_body(module="/etc/passwd")),
    _schema(
        "key is a path", r"schema violation at concurrency_key", valid_body(concurrency_key="../x")
    ),
    _schema(
        "key is a URL",
        r"schema violation at concurrency_key",
        valid_body(concurrency_key="http://x"),
    ),
    _schema(
        "variant is a path", r"schema violation at variant", valid_body(variant="../../etc/passwd")
    ),
    _schema(
        "attachment_id is a path",
        r"schema violation at attachment_id",
        valid_body(module="attachments", attachment_id="/etc/passwd", pipeline_version=1),
        ATTACHMENT_TASK,
    ),
    _schema(
        "pipeline_version zero",
        r"schema violation at pipeline_version",
        valid_body(module="attachments", attachment_id=str(uuid.uuid4()), pipeline_version=0),
        ATTACHMENT_TASK,
    ),
    _schema(
        "control character",
        r"field concurrency_key holds a control character",
        valid_body(concurrency_key="ok\n"),
    ),
    _schema(
        "another module's message",
        r"module 'attachments' is not 'jobs'",
        valid_body(module="attachments"),
    ),
    _schema("a megabyte of kwargs", r"message body is over 4096 bytes", valid_body(pad=BIG)),
    Case(
        "positional arguments that do not fit",
        _positional,
        REJECTED + r"too many positional arguments; tests\.echo takes \(token\)",
    ),
    Case("pickle content type", _pickle, UNTRUSTED + r" of type pickle", reaches_task=False),
    _marked("yaml content type", "application/x-yaml", UNTRUSTED + r" of type yaml"),
    Case("body is not JSON", _not_json, UNDECODABLE + "DecodeError", reaches_task=False),
    Case(
        "unknown task name",
        _unknown_task,
        REJECTED + r"unregistered task 'tests.no_such_task'",
        task="tests.no_such_task",
        reaches_task=False,
    ),
]

UNKNOWN_ATTACHMENT = "foreign message for an unknown attachment"


# ----------------------------------------------------------------------- fixtures


@dataclass
class Delivery:
    cluster: Cluster
    broker: RedisServer
    worker: Proc
    sender: Sender
    tags: dict[str, str]
    attachment_job_id: uuid.UUID
    attachment_id: uuid.UUID


@pytest.fixture(scope="module")
def deployment(
    template_db: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, RedisServer]]:
    """A database cloned from the migrated template, a private Redis, an S3 prefix."""
    admin, template = template_db
    name = f"jobsapp_chaos_{SESSION}_malformed"
    url = create_database(admin, name, template)
    workdir = tmp_path_factory.mktemp("malformed")
    broker = RedisServer(workdir / "redis")
    broker.start()
    bucket = service("JOBSAPP_TEST_S3_BUCKET")
    prefix = f"chaos-malformed-{SESSION}-{uuid.uuid4().hex[:8]}"
    try:
        with cluster_for(
            prefix,
            database_url=url,
            broker=broker,
            storage_url=f"s3://{bucket}/{prefix}",
            s3_endpoint=service("JOBSAPP_TEST_S3_ENDPOINT_URL"),
            workdir=workdir,
        ) as cluster:
            yield cluster, broker
    finally:
        broker.close()
        drop_database(admin, name)


@pytest.fixture(scope="module")
def delivery(
    deployment: tuple[Cluster, RedisServer], tmp_path_factory: pytest.TempPathFactory
) -> Delivery:
    """Every hostile message sent, then a normal job behind them, then a pause for any
    message that would come back."""
    cluster, broker = deployment
    worker = start_worker(cluster, broker, "target")
    sender = Sender(broker.url, tmp_path_factory.mktemp("canary"))
    tags = {case.name: case.send(sender) for case in CASES}
    attachment_id, job_id = uuid.uuid4(), uuid.uuid4()
    foreign = valid_body(
        job_id=str(job_id),
        module="attachments",
        attachment_id=str(attachment_id),
        pipeline_version=1,
    )
    tags[UNKNOWN_ATTACHMENT] = sender.send_task(ATTACHMENT_TASK, foreign)
    row = run_echo(cluster, "after-the-storm")
    assert row["state"] == "succeeded", row
    time.sleep(SETTLE_S)
    return Delivery(cluster, broker, worker, sender, tags, job_id, attachment_id)


def rows(engine: Engine, table: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(table)).mappings()]


# -------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hostile_message_is_refused_once_with_a_log_line_and_no_effect(
    delivery: Delivery, case: Case
) -> None:
    tag = delivery.tags[case.name]
    log = delivery.worker.log()
    refusals = re.findall(case.pattern(tag), log)
    assert len(refusals) == 1, f"{case.name}: {len(refusals)} refusals of {tag} in the log"
    if case.reaches_task:
        # Delivered once: a refused message that came back would be received again.
        assert log.count(f"Task {case.task}[{tag}] received") == 1
        # Rejected (dead-lettered, never requeued): no success is reported for it.
        assert f"Task {case.task}[{tag}] succeeded" not in log
    # It ran no body and claimed nothing: no run, event or outbox row names its job.
    if case.job_id is not None:
        for table in (JOB_RUNS, RUNS, EVENTS, OUTBOX):
            named = [
                r for r in rows(delivery.cluster.engine, table) if str(r["job_id"]) == case.job_id
            ]
            assert named == [], table.name


def test_nothing_hostile_reached_the_journal_or_the_bucket(delivery: Delivery) -> None:
    engine = delivery.cluster.engine
    runs = rows(engine, JOB_RUNS)
    assert [r["params"]["kwargs"] for r in runs] == [{"token": "after-the-storm"}]
    # Its history is the only one; a success's enqueue, claim and succeed are on its run row.
    assert {e["job_id"] for e in rows(engine, EVENTS)} <= {runs[0]["job_id"]}
    assert delivery.cluster.transitions(runs[0]["job_id"])[0] == ("enqueue", 1)
    assert {o["job_id"] for o in rows(engine, OUTBOX)} == {runs[0]["job_id"]}
    assert rows(engine, ATTACHMENTS) == []
    assert rows(engine, RUNS) == []
    assert list(delivery.cluster.store.list("")) == []


def test_pickle_was_never_deserialised(delivery: Delivery) -> None:
    assert list(delivery.sender.canary.iterdir()) == []


def test_a_foreign_message_for_an_unknown_attachment_ends_once_and_makes_nothing(
    delivery: Delivery,
) -> None:
    """Valid schema, no outbox_id (so a claim by insert), but no such attachment: handled
    once, acknowledged, no attachment and no run row made."""
    tag = delivery.tags[UNKNOWN_ATTACHMENT]
    log = delivery.worker.log()
    assert log.count(f"Task {ATTACHMENT_TASK}[{tag}] received") == 1
    assert rows(delivery.cluster.engine, ATTACHMENTS) == []
    assert rows(delivery.cluster.engine, RUNS) == []


def test_a_foreign_message_for_an_unknown_attachment_is_rejected_not_crashed(
    delivery: Delivery,
) -> None:
    tag = delivery.tags[UNKNOWN_ATTACHMENT]
    log = delivery.worker.log()
    assert f"Task {ATTACHMENT_TASK}[{tag}] raised unexpected" not in log
    assert len(re.findall(rf"rejected message {re.escape(tag)} for {ATTACHMENT_TASK}: ", log)) == 1


def test_a_refused_message_is_one_line_in_the_worker_log(delivery: Delivery) -> None:
    """docs/messages.md promises one line per refusal: Celery's tracer wrote its own
    WARNING about the same reject beside jobsapp's line (issue 35)."""
    log = delivery.worker.log()
    refused = re.findall(r"rejected message (\S+) for ", log)
    assert refused
    doubled = [t for t in refused if re.search(rf"\[{re.escape(t)}\] reject requeue=", log)]
    assert doubled == []


def test_the_queue_is_empty_and_the_worker_still_serves(delivery: Delivery) -> None:
    assert delivery.broker.pending() == 0
    assert delivery.broker.unacked() == 0
    assert delivery.worker.alive()
    row = run_echo(delivery.cluster, "still-alive")
    assert row["state"] == "succeeded"
    assert len(rows(delivery.cluster.engine, JOB_RUNS)) == 2


POISON_BODIES = (
    ("tests.echo", b'"just a string"'),  # ValueError: too many values to unpack
    ("tests.echo", b"null"),  # TypeError in the strategy, before the request is built
    ("tests.echo", b"[[], {}]"),  # ValueError: not enough values to unpack
    ("jobsapp.maintenance.reaper", b"7"),  # not only jobsapp's lifecycle tasks
)


def test_a_json_body_that_is_not_a_task_tuple_does_not_kill_the_worker(
    deployment: tuple[Cluster, RedisServer], tmp_path: Path
) -> None:
    cluster, _ = deployment
    # A broker of its own: if the worker dies, the poison message must not reach the others.
    broker = RedisServer(tmp_path / "redis")
    broker.start()
    try:
        worker = start_worker(cluster, broker, "poisoned")
        sender = Sender(broker.url, tmp_path)
        for task, body in POISON_BODIES:
            sender.publish(task, body)
        deadline = time.monotonic() + 10
        refused = 0
        while time.monotonic() < deadline and worker.alive() and refused < len(POISON_BODIES):
            refused = len(re.findall(r"rejected message \S+ for \S+: body is ", worker.log()))
            time.sleep(0.1)
        assert worker.alive(), f"the worker died:\n{worker.log()[-1500:]}"
        assert refused == len(POISON_BODIES)
        assert broker.pending() == 0
        assert broker.unacked() == 0
    finally:
        broker.close()
