"""Flow control with real workers: a global rate limit, and pausing a queue or a domain.

The rate holds across four worker processes, two of them restarted mid-run (the journal
keeps it, not a worker); a run
over its rate takes no attempt. A paused queue's messages already in the broker are handed
back to the journal untouched, those enqueued later wait there unpublished, and all run
once each after the resume.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine

from jobsapp.celery_app import app
from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.flow import gating
from jobsapp.lifecycle.journal import EnqueueOutcome
from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.maintenance import relay
from tests.support import flow_tasks, tasks
from tests.support.journal_view import outbox_rows, run_row
from tests.support.procs import BIN, WORKER_FLAGS, Launcher, Proc, launching, ready
from tests.support.waiting import eventually
from tests.support.workers import in_process_worker

pytestmark = pytest.mark.timeout(240)

RELAY = relay.RelayConfig(grace=timedelta(0))


@pytest.fixture
def subprocesses(pg: Engine, redis_clean: None, tmp_path: Path) -> Iterator[Launcher]:
    """Real workers on this session's services and counters, with the flow tasks."""
    imports = f"{os.environ['JOBSAPP_IMPORTS']},tests.support.flow_tasks"
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "JOBSAPP_IMPORTS": imports,
    }
    with launching(env, tmp_path) as launcher:
        yield launcher


def _workers(launcher: Launcher, count: int, queue: str, prefix: str = "flow") -> list[Proc]:
    """``count`` worker processes (distinct names: distinct hosts) consuming ``queue``."""
    started = [
        launcher.start(
            f"{prefix}{i}",
            [
                str(BIN / "celery"),
                "-A",
                "jobsapp",
                "worker",
                *WORKER_FLAGS,
                "-Q",
                queue,
                "-n",
                f"{prefix}{i}-{uuid.uuid4().hex[:6]}@%h",
            ],
        )
        for i in range(count)
    ]
    ready(*started, timeout=90)
    return started


def _handle(value: object) -> JobHandle:
    assert isinstance(value, JobHandle)
    return value


def _all_succeeded(pg: Engine, handles: list[JobHandle]) -> bool:
    relay.run_once(app, pg, RELAY)  # what beat does every tick: publish what is due
    return all(run_row(pg, h.job_id)["state"] == "succeeded" for h in handles)


def _stop(worker: Proc) -> None:
    """A warm shutdown (SIGTERM to the worker's main process, as ``docker stop`` sends it):
    the current task ends, unstarted messages go back. Not to its process group: a pool
    child that gets it dies mid-task, and its run waits for the reaper, which this test
    does not run."""
    os.kill(worker.pid, signal.SIGTERM)
    worker.wait(timeout=60)


def test_a_rate_holds_across_four_worker_processes_and_restarts(
    subprocesses: Launcher, pg: Engine
) -> None:
    queue, token = f"flow-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    handles = [_handle(flow_tasks.rated.apply_async((token,), queue=queue)) for _ in range(30)]
    first = _workers(subprocesses, 4, queue)
    eventually(lambda: tasks.calls(token) >= 10, timeout=90)
    for worker in first[:2]:  # two hosts restart mid-run: the rate is not theirs to forget
        _stop(worker)
    _workers(subprocesses, 2, queue, prefix="again")
    eventually(lambda: _all_succeeded(pg, handles), timeout=90, interval=0.5)
    assert tasks.calls(token) == 30  # each job's body ran once
    assert {run_row(pg, h.job_id)["attempts"] for h in handles} == {1}  # no attempt spent waiting
    starts = flow_tasks.starts(token)
    rate = flow_tasks.RATE
    # Over any window of one second, at most RATE starts: the (RATE+1)-th start after any
    # start is a full second later.
    crowded = [b - a for a, b in zip(starts, starts[rate:], strict=False) if b - a < 1.0]
    assert crowded == []


def test_a_run_over_its_rate_waits_in_the_journal_without_an_attempt(pg: Engine) -> None:
    tenant, other, token = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    first = _handle(flow_tasks.per_tenant.delay(tenant, token))
    second = _handle(flow_tasks.per_tenant.delay(tenant, token))
    third = _handle(flow_tasks.per_tenant.delay(tenant, token))
    elsewhere = _handle(flow_tasks.per_tenant.delay(other, token))  # a rate of its own
    with in_process_worker(concurrency=1):
        eventually(lambda: run_row(pg, third.job_id)["next_retry_at"] is not None)
        eventually(lambda: tasks.calls(token) == 2)
    assert (
        run_row(pg, first.job_id)["state"]
        == run_row(pg, elsewhere.job_id)["state"]
        == ("succeeded")
    )
    waiting = run_row(pg, second.job_id)
    assert (waiting["state"], waiting["attempts"]) == ("queued", 0)
    started = run_row(pg, first.job_id)["started_at"]
    assert waiting["next_retry_at"] >= started + timedelta(minutes=1)
    # The message is back in the outbox, due with the next start the rate allows.
    [row] = outbox_rows(pg, second.job_id)
    assert row["published_at"] is None
    assert row["available_at"] == waiting["next_retry_at"]
    # The third waits for the start after the second's: a backlog is not published all at
    # once at every start, to be handed back again but one.
    later = run_row(pg, third.job_id)
    assert (later["state"], later["attempts"]) == ("queued", 0)
    assert later["next_retry_at"] >= waiting["next_retry_at"] + timedelta(seconds=59)


def _pending_in_outbox(pg: Engine, handles: list[JobHandle]) -> bool:
    rows = [r for h in handles for r in outbox_rows(pg, h.job_id)]
    return len(rows) == len(handles) and all(r["published_at"] is None for r in rows)


def test_a_paused_queue_runs_nothing_and_loses_nothing(subprocesses: Launcher, pg: Engine) -> None:
    queue, token = f"flow-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    before = [_handle(flow_tasks.plain.apply_async((token,), queue=queue)) for _ in range(3)]
    assert gating.pause(pg, gating.Kind.QUEUE, queue, actor="operator:test", reason="deploy")
    after = [_handle(flow_tasks.plain.apply_async((token,), queue=queue)) for _ in range(3)]
    _workers(subprocesses, 2, queue)
    # The messages published before the pause are handed back to the journal by the
    # workers; those enqueued after it were never published (the producer saw the pause).
    eventually(lambda: _pending_in_outbox(pg, before + after), timeout=30)
    assert relay.run_once(app, pg, RELAY)["published"] == 0
    assert tasks.calls(token) == 0
    assert {
        (run_row(pg, h.job_id)["state"], run_row(pg, h.job_id)["attempts"]) for h in before + after
    } == {("queued", 0)}
    assert gating.resume(pg, gating.Kind.QUEUE, queue, actor="operator:test", reason="done")
    eventually(lambda: _all_succeeded(pg, before + after), timeout=60, interval=0.5)
    assert tasks.calls(token) == 6  # each once
    assert {run_row(pg, h.job_id)["attempts"] for h in before + after} == {1}


def test_a_paused_domain_is_not_published_by_the_relay(pg: Engine, redis_clean: None) -> None:
    token = uuid.uuid4().hex
    assert gating.pause(pg, gating.Kind.DOMAIN, JOBS.module, actor="operator:test", reason="x")
    try:
        with pg.begin() as conn:  # enqueued in the caller's transaction: the relay publishes
            handle = _handle(tasks.echo.apply_async((token,), connection=conn))
        assert relay.run_once(app, pg, RELAY)["published"] == 0
        [row] = outbox_rows(pg, handle.job_id)
        assert row["published_at"] is None
    finally:
        gating.resume(pg, gating.Kind.DOMAIN, JOBS.module, actor="operator:test", reason="x")
    assert relay.run_once(app, pg, RELAY)["published"] >= 1
    with in_process_worker(concurrency=1):
        handle.settled(timeout=30)
    assert tasks.calls(token) == 1


def test_a_foreign_producers_message_is_held_by_a_pause_too(pg: Engine, redis_clean: None) -> None:
    """``send_task`` by name from a service without the journal: no row, no outbox row. The
    worker journals it as queued before its claim, so the pause holds it like any run."""
    token = uuid.uuid4().hex
    elsewhere = Celery("elsewhere", broker=app.conf.broker_url)
    elsewhere.conf.task_default_queue = app.conf.task_default_queue
    assert gating.pause(pg, gating.Kind.DOMAIN, JOBS.module, actor="operator:test", reason="x")
    try:
        sent = elsewhere.send_task(flow_tasks.plain.name, (token,))
        held = JobHandle(uuid.UUID(sent.id), EnqueueOutcome.ENQUEUED, JOBS)
        with in_process_worker(concurrency=1):
            eventually(lambda: _pending_in_outbox(pg, [held]))
        row = run_row(pg, held.job_id)
        assert (row["state"], row["attempts"]) == ("queued", 0)
        assert tasks.calls(token) == 0
    finally:
        gating.resume(pg, gating.Kind.DOMAIN, JOBS.module, actor="operator:test", reason="x")
    with in_process_worker(concurrency=1):
        eventually(lambda: _all_succeeded(pg, [held]))
    assert tasks.calls(token) == 1
    assert run_row(pg, held.job_id)["attempts"] == 1
