"""Flower beside a real worker shows each attempt's lifecycle outcome, read from its HTTP API.

A job that fails transiently then exhausts (``tests.doomed``, 2 attempts) shows RETRY
for attempt 1, naming attempt 2's task id, and FAILURE for attempt 2; a job that succeeds
shows SUCCESS; a second delivery of a finished attempt says it did not run. As a Celery
user reads a failed task there: the body's exception (class and message), a traceback
whose innermost frames are the body's, ending with a note that names the job, and the
arguments the user passed, rendered as Celery's own producer renders them; the same for a
job sent by name with ``send_task`` from a service that does not import the task. What a
revoke, an expiry and a broker's redelivery leave in Flower is read on Redis and on
RabbitMQ.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.utils.saferepr import saferepr
from sqlalchemy import Engine, select

from jobsapp import operator
from jobsapp.lifecycle.journal.tables import JobRun, OutboxMessage
from jobsapp.lifecycle.rules.message import task_id_for
from jobsapp.lifecycle.rules.scrub import scrub
from tests.chaos.harness import RabbitBroker
from tests.support.env import service
from tests.support.procs import BIN, ROOT, Launcher, launching, ready, service_env
from tests.support.servers import RedisServer
from tests.support.waiting import eventually
from tests.support.webserver import free_port

JOB_RUNS = JobRun.__table__
OUTBOX = OutboxMessage.__table__

pytestmark = pytest.mark.timeout(180)

# Deliveries of finished attempts' messages again: (task name, body, task id) each.
REDELIVER = """
import json, sys
from jobsapp.celery_app import app
for at in range(1, len(sys.argv), 3):
    name, body, task_id = sys.argv[at : at + 3]
    app.send_task(name, kwargs=json.loads(body), task_id=task_id)
"""


def _flower_env(
    postgres_url: str, broker: str, tmp_path: Path, redis_url: str | None = None
) -> dict[str, str]:
    """The processes' environment; ``redis_url``: the counters' and dedup keys' Redis,
    when the broker is not one."""
    settings = {"FLOWER_UNAUTHENTICATED_API": "true"}
    if redis_url is not None:
        settings |= {"JOBSAPP_TEST_REDIS_URL": redis_url, "JOBSAPP_REDIS_URL": redis_url}
    return service_env(
        database_url=postgres_url, broker_url=broker, var_dir=tmp_path / "var", settings=settings
    )


def _flower_and_worker(launcher: Launcher) -> int:
    """Flower and a worker, started; returns Flower's port."""
    port = free_port()
    argv = [str(BIN / "celery"), "-A", "jobsapp", "flower", "--address=127.0.0.1"]
    flower = launcher.start("flower", [*argv, f"--port={port}"])
    flower.wait_for_log(r"Visit me at", timeout=60)
    ready(launcher.worker("flower-worker"), timeout=60)
    return port


def _tasks(port: int) -> dict[str, dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/tasks"
    with urllib.request.urlopen(url, timeout=5) as reply:
        found: dict[str, dict[str, Any]] = json.load(reply)
        return found


def _event_counts(port: int) -> dict[tuple[str, str], float]:
    """Flower's ``flower_events_total`` by (task, event type), summed over workers."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    counts: dict[tuple[str, str], float] = {}
    for found in re.finditer(r"^flower_events_total\{([^}]*)\} (\S+)$", text, re.MULTILINE):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1)))
        key = (labels.get("task", ""), labels.get("type", ""))
        counts[key] = counts.get(key, 0.0) + float(found.group(2))
    return counts


def _state(pg: Engine, job_id: str) -> str | None:
    with pg.connect() as conn:
        found = conn.execute(select(JOB_RUNS.c.state).where(JOB_RUNS.c.job_id == job_id))
        return found.scalar()


def _first_message(pg: Engine, job_id: str) -> dict[str, Any]:
    with pg.connect() as conn:
        row = conn.execute(
            select(OUTBOX.c.id, OUTBOX.c.body).where(
                OUTBOX.c.job_id == job_id, OUTBOX.c.attempt == 1
            )
        ).one()
    return {**row.body, "outbox_id": row.id}


def _settled(port: int, *task_ids: str) -> dict[str, dict[str, Any]] | None:
    tasks = _tasks(port)
    # PENDING: Flower heard only the producer's task-sent; the worker's events come within
    # the window its consumer holds them (lifecycle/worker/held_events.py).
    unsettled = (None, "PENDING", "RECEIVED", "STARTED")
    done = all(tasks.get(t, {}).get("state") not in unsettled for t in task_ids)
    return tasks if done else None


def _job_ids(launcher: Launcher, *calls: dict[str, Any]) -> list[str]:
    """The job ids of ``calls`` enqueued by the test's producer."""
    return [r["job_id"] for r in launcher.enqueue(*calls)]


def test_flower_shows_retry_failure_success_and_a_duplicate_delivery(
    pg: Engine, postgres_url: str, module_redis: RedisServer, tmp_path: Path
) -> None:
    broker = module_redis.url
    env = _flower_env(postgres_url, broker, tmp_path)
    with launching(env, tmp_path) as launcher:
        port = _flower_and_worker(launcher)
        token = uuid.uuid4().hex[:8]
        doomed, echo = _job_ids(
            launcher,
            {"task": "tests.doomed", "kwargs": {"token": f"doomed-{token}"}},
            {"task": "tests.echo", "kwargs": {"token": f"echo-{token}"}},
        )
        elsewhere = Celery("elsewhere", broker=broker)
        plain = elsewhere.send_task("tests.doomed", (f"plain-{token}",)).id
        eventually(
            lambda: (
                _state(pg, doomed) == _state(pg, plain) == "failed"
                and _state(pg, echo) == "succeeded"
            ),
            timeout=60,
        )
        duplicate = str(uuid.uuid4())
        redeliver = [
            sys.executable,
            "-c",
            REDELIVER,
            "tests.echo",
            json.dumps(_first_message(pg, echo), default=str),
            duplicate,
        ]
        subprocess.run(redeliver, cwd=ROOT, env=env, timeout=60, check=True)
        ids = [
            task_id_for(uuid.UUID(doomed), 1),
            task_id_for(uuid.UUID(doomed), 2),
            task_id_for(uuid.UUID(echo), 1),
            duplicate,
            plain,
            task_id_for(uuid.UUID(plain), 2),
        ]
        tasks = eventually(lambda: _settled(port, *ids), timeout=60)
        events = _event_counts(port)
    first, last, success, dup, plain_first, plain_last = (tasks[i] for i in ids)
    assert first["state"] == "RETRY", first
    assert first["exception"] == "ValueError('this never works')"
    assert f"next: attempt 2, task {ids[1]}" in first["traceback"]
    assert last["state"] == "FAILURE", last
    for failed, job in ((last, doomed), (plain_last, plain)):
        assert failed["state"] == "FAILURE", failed
        assert failed["exception"] == "ValueError('this never works')"
        _assert_the_bodys_traceback(failed["traceback"], job)
    assert (last["retries"], last["parent_id"], last["root_id"]) == (1, ids[0], ids[0])
    assert success["state"] == "SUCCESS", success
    # The body's return value, as for any Celery task (tests.echo returns None), not a
    # sentence about the attempt.
    assert success["result"] == "None", success
    # One task-started per attempt that ran: Celery's own is not sent beside jobsapp's.
    for name in ("tests.doomed", "tests.echo"):
        assert events[(name, "task-started")] <= events[(name, "task-received")], events
    assert dup["state"] == "SUCCESS", dup
    assert "not run: the job is already terminal" in dup["result"]
    assert [t["name"] for t in (first, last, success, dup)] == ["tests.doomed"] * 2 + [
        "tests.echo"
    ] * 2
    # The arguments the user passed, as Celery's producer renders them for Flower, and
    # scrubbed as every error text is (a parameter named ``token`` reads as a secret).
    user_kwargs = scrub(saferepr({"token": f"doomed-{token}"}))
    assert [(t["args"], t["kwargs"]) for t in (first, last)] == [("()", user_kwargs)] * 2
    echo_kwargs = scrub(saferepr({"token": f"echo-{token}"}))
    assert (success["args"], success["kwargs"]) == ("()", echo_kwargs)
    plain_args = saferepr((f"plain-{token}",))
    assert [(t["args"], t["kwargs"]) for t in (plain_first, plain_last)] == [(plain_args, "{}")] * 2
    # A delivery that started no work shows the message it came as, which names the job.
    assert f"'job_id': '{echo}'" in dup["kwargs"]


def _assert_the_bodys_traceback(text: str, job_id: str) -> None:
    """Innermost frames are the body's (tests/support/tasks.py, ``doomed``); no jobsapp
    wrapper is raised; the last line names the job the attempt belongs to."""
    frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)', text)
    assert frames[-1] == (str(ROOT / "tests" / "support" / "tasks.py"), "doomed"), text
    assert "AttemptFailed" not in text, text
    assert "ValueError: this never works" in text
    assert re.search(
        rf"job {job_id} attempt 2 exhausted: ValueError: this never works\s*$", text
    ), text


def _own_redelivery(pg: Engine, job_id: str, *attempts: int) -> list[str]:
    """The attempts' own messages sent again under their own task ids, as Redis restores an
    unacked message after its worker died (``acks_late``): a producer's argv."""
    argv = [sys.executable, "-c", REDELIVER]
    for attempt in attempts:
        body = {
            **_message(pg, job_id, attempt),
            "outbox_id": _message_id(pg, job_id, attempt),
        }
        own = task_id_for(uuid.UUID(job_id), attempt)
        argv += ["tests.doomed", json.dumps(body, default=str), own]
    return argv


def _message(pg: Engine, job_id: str, attempt: int) -> dict[str, Any]:
    with pg.connect() as conn:
        found = conn.execute(
            select(OUTBOX.c.body).where(OUTBOX.c.job_id == job_id, OUTBOX.c.attempt == attempt)
        )
        body: dict[str, Any] = found.scalar_one()
    return body


def _message_id(pg: Engine, job_id: str, attempt: int) -> int:
    with pg.connect() as conn:
        found = conn.execute(
            select(OUTBOX.c.id).where(OUTBOX.c.job_id == job_id, OUTBOX.c.attempt == attempt)
        )
        return int(found.scalar_one())


@pytest.fixture(params=["redis", "rabbitmq"])
def probe_env(
    request: pytest.FixtureRequest, postgres_url: str, module_redis: RedisServer, tmp_path: Path
) -> Iterator[dict[str, str]]:
    """The probe's processes on the module's Redis, or on a vhost of their own on the
    shared RabbitMQ (its redeliveries and held countdowns are the broker's own)."""
    if request.param == "redis":
        yield _flower_env(postgres_url, module_redis.url, tmp_path)
        return
    vhost = f"jobsapp-flower-{uuid.uuid4().hex[:8]}"
    rabbit = RabbitBroker.create(service("JOBSAPP_TEST_AMQP_URL"), module_redis.url, vhost)
    try:
        yield _flower_env(postgres_url, rabbit.url, tmp_path, redis_url=module_redis.url)
    finally:
        rabbit.close()


def test_flower_keeps_the_journals_end_of_an_expired_job_a_redelivery_and_a_revoke(
    pg: Engine, probe_env: dict[str, str], tmp_path: Path
) -> None:
    """A delivery that starts no work under an attempt's own task id sent Celery's
    task-succeeded, which outranks every state Flower keeps: a failed attempt redelivered
    read SUCCESS, and a job that expired before it started read SUCCESS too. So did a
    running attempt a revoke stopped (the journal: failed/cancelled), its result the text
    "cancelled by a revoke": REVOKED is the state it earned. A redelivered copy of an
    attempt that ended RETRY, after its job ended, and the message of a job cancelled
    while it waited in the worker, read RECEIVED for good: Celery lets a task-received
    replace RETRY, and a terminal job's refusal sent nothing."""
    token = uuid.uuid4().hex[:8]
    looping_call = {"task": "tests.looping", "kwargs": {"token": f"loop-{token}"}}
    doomed_call = {"task": "tests.doomed", "kwargs": {"token": f"doomed-{token}"}}
    expired_call = {
        "task": "tests.echo",
        "kwargs": {"token": f"expired-{token}"},
        "options": {"countdown": 2, "expires": 1},
    }
    cancelled_call = {
        "task": "tests.echo",
        "kwargs": {"token": f"cancelled-{token}"},
        "options": {"countdown": 2},
    }
    env = probe_env
    with launching(env, tmp_path) as launcher:
        port = _flower_and_worker(launcher)
        (looping,) = _job_ids(launcher, looping_call)
        eventually(lambda: _state(pg, looping) == "running", timeout=60)
        operator.cancel(pg, "jobs", uuid.UUID(looping), actor="oleg", reason="runaway loop")
        eventually(lambda: _state(pg, looping) == "failed", timeout=60)
        stopped = task_id_for(uuid.UUID(looping), 1)
        doomed, expired, cancelled = _job_ids(launcher, doomed_call, expired_call, cancelled_call)
        # Cancelled while its message waits out the countdown in the worker (RECEIVED).
        operator.cancel(pg, "jobs", uuid.UUID(cancelled), actor="oleg", reason="not needed")
        eventually(lambda: _state(pg, doomed) == "failed", timeout=60)
        last = task_id_for(uuid.UUID(doomed), 2)
        eventually(lambda: _settled(port, last), timeout=60)
        # Attempt 1 ended RETRY: a copy of it restored after the job ended (its worker lost
        # the connection before the ack) must not leave it RECEIVED, as Celery's state
        # keeps any event after a RETRY.
        redelivered = _own_redelivery(pg, doomed, 2, 1)
        subprocess.run(redelivered, cwd=ROOT, env=env, timeout=60, check=True)
        ours = task_id_for(uuid.UUID(expired), 1)
        eventually(lambda: _settled(port, ours, cancelled), timeout=60)
        # The redelivery's own events have come once a later job's have.
        after = launcher.enqueue({"task": "tests.echo", "kwargs": {"token": f"after-{token}"}})
        tasks = eventually(lambda: _settled(port, after[0]["job_id"]), timeout=60)
    assert _state(pg, expired) == "failed"
    assert tasks[ours]["state"] == "REVOKED", tasks[ours]
    assert tasks[cancelled]["state"] == "REVOKED", tasks[cancelled]
    assert tasks[stopped]["state"] == "REVOKED", tasks[stopped]
    assert tasks[last]["state"] == "FAILURE", tasks[last]
    assert tasks[last]["exception"] == "ValueError('this never works')"
    first = tasks[task_id_for(uuid.UUID(doomed), 1)]
    assert first["state"] == "RETRY", first
