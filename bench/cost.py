"""What one job costs, counted rather than timed: SQL statements, commits, broker
publishes and Python function calls, on the producer (``.delay()``) and in the worker (the
task as Celery's tracer runs it from the delivered message), for a lifecycle task, for
the same task on bare Celery in the same process, and for each feature a job may use (a
chain, a group, a chord, a key limit, a rate limit, a priority). Counts do not depend on
the machine's speed or load, so CI can hold a budget (tests/integration/test_cost_budget.py)
and the lifecycle bench prints the ratios to bare Celery (bench/bench_lifecycle.py).

The no-op job on each side is also counted in a whole worker (``solo worker``): Celery's
solo-pool worker in the process, draining queued jobs from the broker, every thread
counted (the consumer's handling of each message, the task's execution, its events, the
heartbeat), as ``python -m bench profile`` measured "the worker" when the issue's
figures were taken. The ``worker`` count is the task's execution alone, where all of
jobsapp's own work is; the consumer around it is Celery's on both sides.

``python -m bench.cost lifecycle|bare QUEUE [FEATURE ...]`` prints, as one JSON line, each
feature's counts per job (every feature of the side when none is named). Outside the solo
worker only the calling thread is profiled: the heartbeat's thread ticks on a clock, not
per job.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any
from unittest import mock

import redis
from celery import Celery, chain, chord, group
from celery.app.trace import build_tracer
from celery.signals import after_task_publish, before_task_publish, task_postrun
from sqlalchemy import Engine, event

from jobsapp.testing.kit import delivered

# Jobs run before counting (caches, compiled statements, first connections), then counted.
WARM, COUNTED = 10, 40
# The same for the solo worker, which drains what the broker holds (one job per loop turn).
SOLO_WARM, SOLO_COUNTED = 30, 300
SOLO = "solo worker"
# What a worker does on a clock, not per job, and would count at the counted jobs' pace.
SOLO_FLAGS = ("--without-gossip", "--without-mingle", "--without-heartbeat")
ROOT = Path(__file__).resolve().parents[1]
# The no-op job's name on each side, the baseline every feature's price is read against.
NOOP, BARE = "lifecycle", "bare celery"


@dataclass
class Counts:
    statements: float = 0
    commits: float = 0
    publishes: float = 0
    calls: float = 0

    def per_job(self, jobs: int) -> dict[str, float]:
        return {k: round(v / jobs, 1) for k, v in asdict(self).items()}


@contextmanager
def counting() -> Iterator[Counts]:
    """Count what runs in this thread inside the block: statements and commits on every
    engine (the journal's autocommit and relaxed variants too: an autocommit statement is
    its own transaction, counted as a statement only). Background threads (the outbox's
    batched marks, the heartbeat) work on a clock, not per job, and are left out."""
    counts = Counts()
    mine = threading.get_ident()

    def statement(*_: Any, **__: Any) -> None:
        if threading.get_ident() == mine:
            counts.statements += 1

    def commit(*_: Any) -> None:
        if threading.get_ident() == mine:
            counts.commits += 1

    def published(**_: Any) -> None:
        if threading.get_ident() == mine:
            counts.publishes += 1

    def profiled(_frame: FrameType, what: str, _arg: Any) -> None:
        if what == "call":
            counts.calls += 1

    event.listen(Engine, "before_cursor_execute", statement)
    event.listen(Engine, "commit", commit)
    after_task_publish.connect(published, weak=False)
    sys.setprofile(profiled)
    try:
        yield counts
    finally:
        sys.setprofile(None)
        after_task_publish.disconnect(published)
        event.remove(Engine, "before_cursor_execute", statement)
        event.remove(Engine, "commit", commit)


Sent = tuple[str, str, tuple[Any, ...], dict[str, Any]]


@contextmanager
def captured() -> Iterator[list[Sent]]:
    """The (task name, task id, args, kwargs) of every message published inside the block,
    in order: a worker's publishes (a workflow's next steps) are appended as they happen."""
    sent: list[Sent] = []

    def keep(body: Any = None, headers: Any = None, **_: Any) -> None:
        args, kwargs, _embed = body
        sent.append((str(headers["task"]), str(headers["id"]), tuple(args), dict(kwargs)))

    before_task_publish.connect(keep, weak=False)
    try:
        yield sent
    finally:
        before_task_publish.disconnect(keep)


@dataclass(frozen=True)
class Feature:
    """One way of calling: ``call`` makes ``jobs`` jobs (a chord of 10: its members and body)."""

    call: Callable[[], Any]
    jobs: int = 1


def measure(app: Celery, feature: Feature) -> dict[str, dict[str, float]]:
    """The producer's and the worker's counts per job of ``feature``: calls made and
    drained (each delivered message traced, and those its run publishes) before counting,
    then counted. The worker's count is for every job of the calls: a chain's or chord's
    later steps are published by the steps before them."""
    warm, counted = max(2, WARM // feature.jobs), max(4, COUNTED // feature.jobs)
    with captured() as sent:
        for _ in range(warm):
            feature.call()
        _drain(app, sent, 0)
        start = len(sent)
        with counting() as producer:
            for _ in range(counted):
                feature.call()
        with counting() as worker:
            ran = _drain(app, sent, start)
    jobs = counted * feature.jobs
    assert ran == jobs, f"{ran} messages ran for {jobs} jobs"
    return {"producer": producer.per_job(jobs), "worker": worker.per_job(jobs)}


def _drain(app: Celery, sent: list[Sent], start: int) -> int:
    """Run every message from ``start`` on as a worker would, and those their runs send."""
    tracers: dict[str, Any] = {}
    done = start
    while done < len(sent):
        name, task_id, args, kwargs = sent[done]
        if name not in tracers:
            tracers[name] = build_tracer(name, app.tasks[name], app=app, eager=False)
        tracers[name](task_id, args, kwargs, delivered(app, task_id, "cost"))
        done += 1
    return done - start


def solo_worker_calls(app: Celery, feature: Feature) -> dict[str, float]:
    """Python calls per job in Celery's solo-pool worker run in this process, on every
    thread, while it drains ``feature``'s queued jobs (the app's default queue, emptied
    first); the worker stops itself (a warm shutdown) after the last counted job."""
    queue = str(app.conf.task_default_queue)
    # Alone on a shared broker: no other test's control broadcast or event receiver
    # meets it (both sides alike).
    app.conf.update(worker_enable_remote_control=False, event_exchange=f"{queue}.events")
    with app.connection_for_write() as conn:
        channel: Any = conn.default_channel  # kombu types it as StdChannel
        channel.queue_purge(queue)
    for _ in range(SOLO_WARM + SOLO_COUNTED):
        feature.call()
    counted, done = Counts(), [0]

    def profiled(_frame: FrameType, what: str, _arg: Any) -> None:
        if what == "call" and SOLO_WARM <= done[0] < SOLO_WARM + SOLO_COUNTED:
            counted.calls += 1

    def finished(**_: Any) -> None:
        done[0] += 1
        if done[0] == SOLO_WARM + SOLO_COUNTED:
            os.kill(os.getpid(), signal.SIGTERM)

    task_postrun.connect(finished, weak=False)
    threading.setprofile(profiled)
    sys.setprofile(profiled)
    try:
        with suppress(SystemExit), _events_flushed_by_count():
            app.worker_main(["worker", "-P", "solo", "-l", "warning", "-Q", queue, *SOLO_FLAGS])
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        task_postrun.disconnect(finished)
    assert done[0] == SOLO_WARM + SOLO_COUNTED, f"the solo worker ran {done[0]} jobs"
    return {"calls": round(counted.calls / SOLO_COUNTED, 1)}


@contextmanager
def _events_flushed_by_count() -> Iterator[None]:
    """Held task events published by their count alone (24 to a message), never by their
    window: below 96 jobs a second a window publishes fewer than 24, so its calls per job
    followed this machine's speed (a loaded CI machine counted 4% more than a quiet one).
    A worker that keeps up publishes by count: that is the cost counted."""
    from jobsapp.lifecycle.worker import celery_view, held_events

    never = 24 * 3600.0
    with (
        mock.patch.object(celery_view, "EVENTS_WINDOW", never),
        mock.patch.object(held_events, "EVENTS_WINDOW", never),
    ):
        yield


def _noop() -> None:
    """The job whose cost is all lifecycle."""


def _keyed(n: int) -> None:
    """A job of a limited key of its own (``n``): the price of a key's slot."""
    del n


def lifecycle_features(app: Celery) -> dict[str, Feature]:
    """The no-op lifecycle job, and the same job with each feature it may use."""
    from jobsapp.lifecycle import lifecycle_task

    noop = lifecycle_task(app, name="bench.cost.noop")(_noop)
    keyed = lifecycle_task(app, name="bench.cost.keyed", key="cost:{n}", limit=2)(_keyed)
    rated = lifecycle_task(app, name="bench.cost.rated", rate="100000/s")(_noop)
    keys = itertools.count()
    return {
        NOOP: Feature(noop.delay),
        # A canvas anew each call: calling one twice would be the same workflow again.
        "chain of 3": Feature(lambda: chain(noop.si(), noop.si(), noop.si()).delay(), 3),
        "group of 10": Feature(lambda: group(noop.si() for _ in range(10)).delay(), 10),
        "chord of 10": Feature(
            lambda: chord([noop.si() for _ in range(10)], noop.si()).delay(), 11
        ),
        "key limit": Feature(lambda: keyed.delay(next(keys))),
        "rate limit": Feature(rated.delay),
        "priority": Feature(lambda: noop.apply_async(priority=5)),
    }


def _side(name: str, queue: str) -> tuple[Celery, dict[str, Feature]]:
    """The app and the features of one side: jobsapp's lifecycle tasks, or bare Celery's
    no-op task on the same broker with the events jobsapp ships."""
    if name == "lifecycle":
        from jobsapp.celery_app import app
        from jobsapp.lifecycle.flow import gating

        app.conf.task_default_queue = queue
        # The process reads the paused queues once a second, whatever its jobs: a cost of
        # the clock, not of a job. Its view, read once, stays fresh here.
        gating._clock = lambda: 0.0
        return app, lifecycle_features(app)
    bare = Celery("bare-cost", broker=os.environ["JOBSAPP_BROKER_URL"])
    bare.conf.update(
        task_default_queue=queue,
        task_ignore_result=True,
        task_send_sent_event=True,
        worker_send_task_events=True,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
    )
    return bare, {BARE: Feature(bare.task(name="bench.cost.bare_noop")(_noop).delay)}


# Per feature, per side (producer, worker), per count: per job.
Measured = dict[str, dict[str, dict[str, float]]]


def measured(side: str, queue: str, env: Mapping[str, str], *features: str) -> Measured:
    """``features`` of ``side`` (all when none is named), counted in a fresh process on the
    database and broker ``env`` names (``JOBSAPP_DATABASE_URL``, ``JOBSAPP_BROKER_URL``);
    its messages, left in ``queue``, are deleted after."""
    broker = env["JOBSAPP_BROKER_URL"]
    child = {**env, "PYTHONPATH": str(ROOT), "JOBSAPP_IMPORTS": ""}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "bench.cost", side, queue, *features],
            cwd=ROOT,
            env=child,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        client = redis.Redis.from_url(broker)
        # A priority's messages are in lists of their own, named after the queue; the solo
        # worker's bindings in kombu's keys ending in it.
        for key in client.scan_iter(match=f"*{queue}*"):
            client.delete(key)
    if done.returncode != 0:
        raise RuntimeError(f"bench.cost {side} failed: {done.stderr[-3000:]}")
    found: Measured = json.loads(done.stdout.splitlines()[-1])
    return found


def main(side: str, queue: str, names: list[str]) -> Measured:
    app, features = _side(side, queue)
    found = {name: measure(app, features[name]) for name in names or features}
    for name in {NOOP, BARE} & set(found):
        found[name][SOLO] = solo_worker_calls(app, features[name])
    return found


if __name__ == "__main__":
    # A process of its own: the counts depend on nothing an earlier test left behind. The
    # solo worker has sent sys.stdout to its log (``worker_redirect_stdouts``).
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3:])), file=sys.__stdout__)
