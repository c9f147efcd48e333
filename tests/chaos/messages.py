"""Foreign broker messages for the chaos tests: made here with kombu, never by jobsapp.

``Sender`` puts raw protocol-2 messages (headers built here, any body, content type and
encoding) or ``send_task`` messages of a bare Celery app on the worker's queue, on Redis or
on RabbitMQ. ``start_worker`` and ``run_echo`` are the real worker and a normal job behind
the hostile ones.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery import Celery
from kombu import Connection, Exchange, Queue
from sqlalchemy import select

from jobsapp.lifecycle.journal.tables import JobRun
from tests.chaos.harness import QUEUE, Broker, Cluster
from tests.support.procs import BIN, WORKER_FLAGS, Proc, ready

JOB_RUNS = JobRun.__table__
SCHEMA_VERSION = 1
ENQUEUED_AT = "2026-11-30T00:00:00+00:00"
DROP: Any = object()  # valid_body(field=DROP) leaves the field out


def valid_body(**changes: Any) -> dict[str, Any]:
    """A body that passes jobs.schema.json (a foreign producer's: no outbox_id)."""
    body: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "job_id": str(uuid.uuid4()),
        "module": "jobs",
        "attempt": 1,
        "enqueued_at": ENQUEUED_AT,
    }
    body.update(changes)
    return {k: v for k, v in body.items() if v is not DROP}


def proto2_headers(name: str, task_id: str) -> dict[str, Any]:
    """The headers Celery 5's own producer sends for a task."""
    return {
        "lang": "py",
        "task": name,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "shadow": None,
        "eta": None,
        "expires": None,
        "retries": 0,
        "timelimit": [None, None],
        "argsrepr": "()",
        "kwargsrepr": "{}",
        "origin": "chaos@foreign",
        "ignore_result": True,
    }


def proto2_body(kwargs: Mapping[str, Any], args: tuple[Any, ...] = ()) -> list[Any]:
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    return [list(args), dict(kwargs), embed]


@dataclass
class Raw:
    """One message as it goes on the wire; ``body`` bytes are sent as they are."""

    headers: dict[str, Any]
    body: bytes | list[Any] | Any
    content_type: str = "application/json"
    content_encoding: str = "utf-8"
    properties: dict[str, Any] = field(default_factory=dict)

    def payload(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


@dataclass
class Sender:
    """Puts messages on the worker's queue without going through jobsapp."""

    broker_url: str
    canary: Path

    def send_task(self, name: str, kwargs: Mapping[str, Any], *, args: tuple[Any, ...] = ()) -> str:
        """``send_task`` of a bare Celery app: what a Django app knowing only the name does."""
        task_id = str(uuid.uuid4())
        producer = Celery("chaos-foreign-producer", broker=self.broker_url, set_as_current=False)
        producer.conf.update(task_serializer="json", broker_connection_retry_on_startup=True)
        try:
            producer.send_task(name, args=args, kwargs=dict(kwargs), task_id=task_id, queue=QUEUE)
        finally:
            producer.close()
        return task_id

    def publish(
        self,
        name: str,
        body: bytes | list[Any],
        *,
        content_type: str = "application/json",
        content_encoding: str = "utf-8",
        headers: Mapping[str, Any] | None = None,
    ) -> str:
        """A raw protocol-2 message: headers made here, the body as given (bytes unencoded)."""
        task_id = str(uuid.uuid4())
        raw = Raw(
            {**proto2_headers(name, task_id), **(headers or {})},
            body,
            content_type,
            content_encoding,
            {"correlation_id": task_id},
        )
        self.publish_raw([raw])
        return task_id

    def publish_raw(self, messages: Iterable[Raw]) -> None:
        """Messages exactly as given, over one connection."""
        exchange = Exchange(QUEUE, type="direct")
        with Connection(self.broker_url) as conn:
            producer = conn.Producer()
            for raw in messages:
                producer.publish(
                    raw.payload(),
                    exchange=exchange,
                    routing_key=QUEUE,
                    declare=[Queue(QUEUE, exchange, routing_key=QUEUE)],
                    content_type=raw.content_type,
                    content_encoding=raw.content_encoding,
                    headers=raw.headers,
                    delivery_mode=2,
                    retry=True,
                    **raw.properties,
                )


def start_worker(cluster: Cluster, broker: Broker, name: str) -> Proc:
    argv = [str(BIN / "celery"), "-A", "jobsapp", "worker", *WORKER_FLAGS, "-n", f"{name}@%h"]
    env = {
        "JOBSAPP_IMPORTS": "tests.support.tasks",
        "JOBSAPP_BROKER_URL": broker.url,
        "JOBSAPP_REDIS_URL": broker.dedup_url,
        "JOBSAPP_TEST_REDIS_URL": broker.dedup_url,
    }
    proc = cluster.launcher.start(name, argv, env)
    ready(proc, timeout=45)
    return proc


def run_echo(cluster: Cluster, token: str, timeout: float = 30.0) -> Mapping[str, Any]:
    """A normal job through jobsapp's own producer; its row once it is terminal."""
    (handle,) = cluster.launcher.enqueue({"task": "tests.echo", "kwargs": {"token": token}})
    job_id = uuid.UUID(handle["job_id"])

    def done() -> Mapping[str, Any] | None:
        with cluster.engine.connect() as conn:
            row = conn.execute(select(JOB_RUNS).where(JOB_RUNS.c.job_id == job_id)).mappings()
            found = row.first()
        return found if found is not None and found["state"] in ("succeeded", "failed") else None

    row = cluster.wait_for(done, f"echo {token} finished", timeout)
    return dict(row)


ECHO = "tests.echo"


HEADER_FAULTS = {
    "no id header": ({"id": None}, r"no id header"),
    "task header is a list": ({"task": [ECHO]}, r"task header is a list, not a string"),
    "timelimit is a string": ({"timelimit": "10"}, r"timelimit header is a str, not \[soft"),
}


def faulty(changes: dict[str, Any]) -> tuple[str, Raw]:
    task_id = str(uuid.uuid4())
    headers = {**proto2_headers(ECHO, task_id), "origin": task_id, **changes}
    if changes.get("id", "") is None:
        del headers["id"]
    return task_id, Raw(headers, proto2_body({"token": task_id}))
