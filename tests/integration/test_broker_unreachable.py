"""A broker that is down must cost a producer milliseconds and beat a bounded moment.

"Down" is a closed local port (connection refused) or a blackhole: a local socket that
listens and never answers, so the client connects and then waits for a reply. Both are
on the loopback; nothing leaves the machine.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from celery import Celery
from sqlalchemy import Engine, select

from jobsapp.celery_app import app
from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import OUTBOX
from jobsapp.lifecycle.transport import publisher
from jobsapp.lifecycle.worker import celery_view
from jobsapp.maintenance import reaper, relay
from tests.support import tasks
from tests.support.attachments import environment
from tests.support.databases import use_database
from tests.support.journal_view import held_by, run_row
from tests.support.planted import JOBS, ago, enqueue, start
from tests.support.servers import closed_port

# Every test here asserts how long a call or a pass took.
pytestmark = pytest.mark.serial

SCHEMES = ("redis", "pyamqp")
# The blackhole's wait: what JOBSAPP_PUBLISH_TIMEOUT allows a silent broker.
SILENT_TIMEOUT = 0.3


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A port whose kernel completes the handshake and nobody ever answers."""
    with socket.socket() as sink:
        sink.bind(("127.0.0.1", 0))
        sink.listen(1024)
        yield int(sink.getsockname()[1])


def url(scheme: str, port: int) -> str:
    if scheme == "redis":
        return f"redis://127.0.0.1:{port}/0"
    return f"pyamqp://guest:guest@127.0.0.1:{port}//"


@pytest.fixture(autouse=True)
def fresh_breaker() -> Iterator[None]:
    """A short publish timeout; other tests of the session inherit no open breaker."""
    publisher.broker_answered()
    with environment(JOBSAPP_PUBLISH_TIMEOUT=str(SILENT_TIMEOUT)):
        yield
    publisher.broker_answered()


def _delays(n: int, *, reset_breaker: bool) -> tuple[list[float], list[uuid.UUID]]:
    took, ids = [], []
    for i in range(n):
        if reset_breaker:
            publisher.broker_answered()  # so every call really tries the broker
        started = time.monotonic()
        handle = tasks.echo.delay(f"down-{i}")
        took.append(time.monotonic() - started)
        ids.append(handle.job_id)
    return took, ids


def _unpublished(db: Engine, job_ids: list[uuid.UUID]) -> bool:
    with db.connect() as conn:
        rows = conn.execute(
            select(OUTBOX.c.published_at, OUTBOX.c.publish_failures).where(
                OUTBOX.c.job_id.in_(job_ids)
            )
        ).all()
    return len(rows) == len(job_ids) and all(r == (None, 0) for r in rows)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_delay_returns_at_once_when_the_broker_refuses(
    db: Engine, scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app.conf, "broker_url", url(scheme, closed_port()))
    tasks.echo.delay("warm-up")  # the first call imports the transport
    took, ids = _delays(10, reset_breaker=True)
    assert statistics.median(took) < 0.1, took
    # A hang would take the publish timeout (2 s) or kombu's retries; one call of ten took
    # 0.88 s beside a CPU-bound neighbour (scheduling), which is no hang.
    assert max(took) < 1.0, took
    # Every job is safe in the journal; its message waits for the relay.
    assert all(run_row(db, job_id)["state"] == "queued" for job_id in ids)
    assert _unpublished(db, ids)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_silent_broker_costs_one_timeout_then_the_fast_path_stands_aside(
    db: Engine, scheme: str, blackhole: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app.conf, "broker_url", url(scheme, blackhole))
    tasks.echo.delay("warm-up")
    (first,), _ = _delays(1, reset_breaker=True)
    assert first < SILENT_TIMEOUT + 1.0
    took, ids = _delays(10, reset_breaker=False)
    assert statistics.median(took) < 0.1, took
    assert _unpublished(db, ids)


def _down_app(broker_url: str) -> Celery:
    down = Celery("broker-down", broker=broker_url, set_as_current=False)
    down.conf.update(task_serializer="json", accept_content=["json"])
    return down


@pytest.mark.parametrize("silent", [False, True], ids=["refused", "blackhole"])
def test_a_relay_pass_over_500_due_rows_is_short_and_the_reaper_still_reaps(
    db: Engine, silent: bool, blackhole: int
) -> None:
    due = [enqueue(db, at=ago(60)) for _ in range(500)]
    dead_run = start(db, at=ago(120))
    down = _down_app(url("redis", blackhole if silent else closed_port()))
    cfg = reaper.ReaperConfig(stale_after=timedelta(seconds=30))

    started = time.monotonic()
    counts = relay.run_once(down, db, relay.RelayConfig())
    reaped = reaper.run_once(db, cfg, down)
    elapsed = time.monotonic() - started

    assert elapsed < 5.0
    assert counts["published"] == 0
    assert reaped[JOBS.module] == 1
    assert run_row(db, dead_run)["state"] == "queued"
    # A broker outage counts against no row: every one is still due, none backed off.
    assert _unpublished(db, due)
    down.close()


def test_on_sqlite_a_relay_waiting_on_a_silent_broker_blocks_no_heartbeat(
    sqlite_url: str, blackhole: int
) -> None:
    # Every SQLite transaction holds the database's write lock (BEGIN IMMEDIATE).
    db = use_database(sqlite_url)
    for _ in range(3):
        enqueue(db, at=ago(60))
    live = start(db, at=ago(1))
    down = _down_app(url("redis", blackhole))
    with environment(JOBSAPP_PUBLISH_TIMEOUT="2.0"):
        relay_pass = threading.Thread(target=relay.run_once, args=(down, db, relay.RelayConfig()))
        relay_pass.start()
        time.sleep(0.5)  # the relay now waits for the silent broker
        started = time.monotonic()
        with db.begin() as conn:
            assert journal.heartbeat(
                conn, JOBS, live, 1, token=held_by(conn, JOBS, live), now=utcnow()
            )
        waited = time.monotonic() - started
        relay_pass.join(timeout=30)
    down.close()
    assert waited < 0.5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_leaving_pool_childs_held_events_wait_a_silent_broker_one_timeout(
    scheme: str, blackhole: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool child that leaves (``--max-tasks-per-child``) publishes the task-started
    events it holds from its main thread, in Celery's ``worker_process_shutdown``. On a
    silent broker that publish waited as long as the socket let it (for ever here, and a
    network's retransmissions, minutes, elsewhere): the child never left, and its slot of
    the pool with it. Bounded by the publish timeout, the events are given up."""
    monkeypatch.setattr(app.conf, "broker_url", url(scheme, blackhole))
    host = f"leaving-{uuid.uuid4().hex[:8]}@here"
    started = time.monotonic()
    with contextlib.suppress(*publisher.BROKER_ERRORS):  # refused at the send: as good
        celery_view.send_started(app, str(uuid.uuid4()), host, {"name": "tests.echo"})
        celery_view.flush_held()  # what the child runs as it leaves
    assert time.monotonic() - started < 10 * SILENT_TIMEOUT
