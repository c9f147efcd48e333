"""Canvas under chaos (issue 20): workers SIGKILLed while chains and chords run.

Two supervised workers (a dead one is replaced), beat with the short cadences (reaper and
relay every second), and a producer process that sends chains of four steps and chords of
five members with a body (tests/chaos/canvas_work.py). While they run, workers are
SIGKILLed (process group) at points of progress drawn from a seeded random: every run
kills at the same numbers of finished steps, and waits for them instead of a clock. Then,
over every workflow:

- it ended complete: each of its steps has a run that succeeded (a flaky step after the
  first attempt it fails on purpose), and its last step (the chord's body) returned the
  expected value;
- no body ran twice in one attempt: every ``(job_id, attempt)`` a body recorded is unique,
  is one the journal's attempt counter reached, and the succeeding attempt is among them;
- a chord's body was enqueued once and succeeded once.

One window a random kill almost never hits has a crash point of its own: the pool process
dies right after the COMMIT in which a chord's last member wrote the body, before
publishing it. The quick variant and that window run in CI on Redis and on RabbitMQ. The
full sizes of the issue (50 chains, 20 chords) are marked ``soak``:
``pytest tests/chaos/test_canvas_chaos.py -m soak``.
"""

from __future__ import annotations

import json
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.lifecycle.journal.workflow import STEPS
from jobsapp.lifecycle.rules.states import State, Transition
from jobsapp.monitor import browse
from tests.chaos.canvas_work import CHAIN_INCREMENTS, CHORD_MEMBERS, FLAKY_PATHS, LOG_ENV
from tests.chaos.harness import Cluster, start_all, wait_log
from tests.support.procs import Proc, Supervisor, ready

RUNS = JOBS.table
WORKERS = 2
SEED = 20


@dataclass(frozen=True)
class Size:
    chains: int
    chords: int
    kills: int

    @property
    def steps(self) -> int:
        return self.chains * len(CHAIN_INCREMENTS) + self.chords * (CHORD_MEMBERS + 1)


QUICK = Size(chains=10, chords=4, kills=2)
FULL = Size(chains=50, chords=20, kills=12)


@dataclass(frozen=True)
class Sent:
    """One workflow as the producer printed it."""

    kind: str
    workflow_id: uuid.UUID
    final: uuid.UUID
    expected: int
    flaky: bool

    @classmethod
    def parse(cls, line: str) -> Sent:
        data = json.loads(line)
        return cls(
            data["kind"],
            uuid.UUID(data["workflow_id"]),
            uuid.UUID(data["final"]),
            data["expected"],
            data["flaky"],
        )

    def planned_attempts(self, path: str) -> int:
        """2 for the step that fails its first attempt on purpose, 1 for the others."""
        return 2 if self.flaky and path == FLAKY_PATHS[self.kind] else 1


# ------------------------------------------------------------------------------ running


def _succeeded(cluster: Cluster) -> int:
    stmt = select(func.count()).select_from(RUNS).where(RUNS.c.state == State.SUCCEEDED.value)
    with cluster.engine.connect() as conn:
        return int(conn.execute(stmt).scalar_one())


def _reached(cluster: Cluster, point: int) -> bool:
    return _succeeded(cluster) >= point


def _consuming(supervisor: Supervisor) -> list[Proc]:
    return [p for p in supervisor.workers if p.alive() and " ready." in p.log()]


def _busy(cluster: Cluster, workers: list[Proc]) -> list[Proc]:
    """Those of ``workers`` running a step now (the run's ``worker`` is ``name@host:pid``),
    or all of them when none is: a kill mid-step is the one that costs an attempt."""
    stmt = select(RUNS.c.worker).where(RUNS.c.state == State.RUNNING.value)
    with cluster.engine.connect() as conn:
        names = {str(w).split("@", 1)[0] for w in conn.execute(stmt).scalars()}
    return [p for p in workers if p.name in names] or workers


def _kill_during(cluster: Cluster, supervisor: Supervisor, size: Size) -> int:
    """SIGKILL a consuming worker (one running a step, if any) each time the succeeded
    steps reach a point drawn from the seeded random (within the first three quarters of
    the work, so each kill lands while steps are still running or queued)."""
    rng = random.Random(SEED)
    points = sorted(rng.sample(range(1, size.steps * 3 // 4), size.kills))
    for point in points:
        cluster.wait_for(partial(_reached, cluster, point), f"{point} steps done", 120)
        consuming = cluster.wait_for(lambda: _consuming(supervisor), "a consuming worker", 60)
        rng.choice(_busy(cluster, consuming)).kill()
    return len(points)


def _sent(producer: Proc, size: Size) -> list[Sent]:
    assert producer.wait(120) == 0, producer.log()[-3000:]
    sent = [Sent.parse(line) for line in producer.log().splitlines() if line.startswith("{")]
    assert len(sent) == size.chains + size.chords, producer.log()[-3000:]
    return sent


def _finals(cluster: Cluster, sent: list[Sent]) -> dict[uuid.UUID, Any]:
    stmt = select(RUNS.c.job_id, RUNS.c.result).where(
        RUNS.c.job_id.in_([s.final for s in sent]), RUNS.c.state == State.SUCCEEDED.value
    )
    with cluster.engine.connect() as conn:
        return {row.job_id: row.result for row in conn.execute(stmt)}


def _with_bodies(cluster: Cluster, tmp_path: Path) -> Path:
    """Every process started from now on imports the bodies, which log to the path returned."""
    log = tmp_path / "bodies.log"
    cluster.launcher.env |= {"JOBSAPP_IMPORTS": "tests.chaos.canvas_work", LOG_ENV: str(log)}
    return log


def _producer(cluster: Cluster, size: Size) -> Proc:
    argv = [sys.executable, "-m", "tests.chaos.canvas_work", str(size.chains), str(size.chords)]
    return cluster.launcher.start("producer", argv)


def _all_done(cluster: Cluster, sent: list[Sent], timeout: float) -> None:
    cluster.wait_for(
        lambda: len(_finals(cluster, sent)) == len(sent),
        "every workflow's last step succeeded",
        timeout,
    )


def run_workflows(cluster: Cluster, size: Size, tmp_path: Path) -> tuple[list[Sent], Path, int]:
    """Send ``size``'s workflows while killing workers; returns once every last step
    succeeded (what was sent, the bodies' log, the kills)."""
    log = _with_bodies(cluster, tmp_path)
    # Started together: each process takes seconds to import on a loaded CI core.
    producer = _producer(cluster, size)
    beat = cluster.beat()
    supervisor = Supervisor(cluster.launcher, size=WORKERS, prefix="canvas")
    try:
        ready(beat, *supervisor.workers, timeout=45)
        kills = _kill_during(cluster, supervisor, size)
        sent = _sent(producer, size)
        _all_done(cluster, sent, 60 + size.steps)
    finally:
        supervisor.stop()
    return sent, log, kills


# --------------------------------------------------------------------------- invariants


Row = Mapping[str, Any]


def _steps_and_runs(cluster: Cluster, sent: list[Sent]) -> Iterator[tuple[Sent, Row, Row]]:
    """Every step of every workflow, with its run (KeyError: a step that never ran)."""
    by_id = {s.workflow_id: s for s in sent}
    with cluster.engine.connect() as conn:
        steps = [
            dict(r)
            for r in conn.execute(
                select(STEPS).where(STEPS.c.workflow_id.in_(list(by_id)))
            ).mappings()
        ]
        runs = {
            r["job_id"]: dict(r)
            for r in conn.execute(
                select(RUNS).where(RUNS.c.workflow_id.in_(list(by_id)))
            ).mappings()
        }
    for step in steps:
        yield by_id[step["workflow_id"]], step, runs[step["job_id"]]


def check_complete(cluster: Cluster, sent: list[Sent]) -> list[tuple[Row, int]]:
    """Each workflow's steps all succeeded, a flaky step after its planned failure; its
    last one returned the expected value. Returns each run with its planned attempts."""
    finals = _finals(cluster, sent)
    assert {s.final: finals[s.final] for s in sent} == {s.final: s.expected for s in sent}
    per_workflow: Counter[uuid.UUID] = Counter()
    runs = []
    for workflow, step, run in _steps_and_runs(cluster, sent):
        assert (run["state"], run["workflow_id"]) == (State.SUCCEEDED.value, workflow.workflow_id)
        planned = workflow.planned_attempts(step["path"])
        assert run["attempts"] >= planned, (step["path"], run)
        per_workflow[workflow.workflow_id] += 1
        runs.append((run, planned))
    wanted = {"chain": len(CHAIN_INCREMENTS), "chord": CHORD_MEMBERS + 1}
    assert per_workflow == {s.workflow_id: wanted[s.kind] for s in sent}
    return runs


def check_bodies(log: Path, runs: list[tuple[Row, int]]) -> int:
    """Every body run is an attempt the journal counted, once; returns how many attempts
    more than planned the kills cost (each a new attempt of the step cut short)."""
    recorded = Counter(tuple(line.split()) for line in log.read_text().splitlines())
    twice = {key: n for key, n in recorded.items() if n > 1}
    assert not twice, f"a body ran twice in one attempt: {twice}"
    attempts: dict[str, set[int]] = {}
    for job_id, attempt in recorded:
        attempts.setdefault(job_id, set()).add(int(attempt))
    for run, _ in runs:
        ran = attempts.pop(str(run["job_id"]), set())
        assert run["attempts"] in ran, (run, ran)  # the succeeding attempt ran its body
        assert ran <= set(range(1, run["attempts"] + 1)), (run, ran)
    assert not attempts, f"bodies ran for jobs of no step: {attempts}"
    return sum(run["attempts"] - planned for run, planned in runs)


def check_chord_bodies(cluster: Cluster, sent: list[Sent]) -> None:
    """A chord's body: enqueued once, succeeded once, as its job page's timeline shows
    (the operators' reader of the journal, whichever rows hold the happy path)."""
    for body in (s.final for s in sent if s.kind == "chord"):
        detail = browse.job_detail(cluster.engine, JOBS.module, body)
        assert detail is not None
        moves = Counter(event.transition for event in detail.events)
        assert (moves[Transition.ENQUEUE], moves[Transition.SUCCEED]) == (1, 1), moves


def canvas_chaos(
    cluster: Cluster, size: Size, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    sent, log, kills = run_workflows(cluster, size, tmp_path)
    runs = check_complete(cluster, sent)
    extra = check_bodies(log, runs)
    check_chord_bodies(cluster, sent)
    with capsys.disabled():
        print(
            f"\ncanvas chaos: {size.chains} chains x {len(CHAIN_INCREMENTS)}, {size.chords} "
            f"chords x {CHORD_MEMBERS} on {WORKERS} workers: {kills} kills, {extra} attempts "
            f"more than planned, {time.monotonic() - started:.1f}s"
        )
    assert kills == size.kills


# ------------------------------------------------------------------------------ a window


def _step_run(cluster: Cluster, workflow_id: uuid.UUID, path: str) -> Row:
    with cluster.engine.connect() as conn:
        job_id = conn.execute(
            select(STEPS.c.job_id).where(STEPS.c.workflow_id == workflow_id, STEPS.c.path == path)
        ).scalar_one()
        return dict(conn.execute(select(RUNS).where(RUNS.c.job_id == job_id)).mappings().one())


def member_dies_after_commit_before_publish(cluster: Cluster, tmp_path: Path) -> None:
    """A worker's pool process dies right after the COMMIT of the chord member's success
    that wrote the chord's body, before publishing it (the same code path publishes a
    chain's next step). The body waits in the outbox, unpublished; beat's relay publishes
    it, and the chord completes with every body run once."""
    log = _with_bodies(cluster, tmp_path)
    size = Size(chains=0, chords=1, kills=0)
    producer = _producer(cluster, size)
    crash_at = {"a": "step_after_commit_before_successors"}
    (a,) = start_all(cluster, "a", beat=False, crash_at=crash_at)
    (sent,) = _sent(producer, size)
    wait_log([a], r"exited with 'signal 9 \(SIGKILL\)'")
    # The last member's message, handed back by the main process, is a no-op now.
    wait_log([a], "no work, the job is already terminal")
    # A warm shutdown, so that no-op's ack reaches the broker before the worker exits: a
    # SIGKILL right after its log line could leave it unacked, and RabbitMQ requeues it.
    a.popen.terminate()
    a.wait(30)

    body = _step_run(cluster, sent.workflow_id, "0.body")
    assert (body["job_id"], body["state"], body["attempts"]) == (sent.final, "queued", 0)
    (message,) = cluster.outbox(sent.final)
    assert (message["published_at"], message["publish_count"]) == (None, 0)
    assert cluster.broker.pending() == 0

    # Not the relay's unclaimed check (tests/chaos/harness.py: 2 s), which republished the
    # body once while a fresh worker slowed by a loaded machine had taken it and not yet
    # claimed it (a clean-clone CI run beside a CPU hog): the count asserted is the relay's.
    unhurried = {"JOBSAPP_UNCLAIMED_AFTER": "60"}
    ready(cluster.beat(env=unhurried), cluster.worker("b"), timeout=45)
    _all_done(cluster, [sent], 30)
    runs = check_complete(cluster, [sent])
    assert check_bodies(log, runs) == 0  # no step taken again
    check_chord_bodies(cluster, [sent])
    (message,) = cluster.outbox(sent.final)
    assert message["publish_count"] == 1


# -------------------------------------------------------------------------------- tests


@pytest.mark.timeout(180)
def test_workflows_complete_despite_worker_kills_on_redis(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    canvas_chaos(cluster, QUICK, tmp_path, capsys)


@pytest.mark.rabbitmq
@pytest.mark.timeout(180)
def test_workflows_complete_despite_worker_kills_on_rabbitmq(
    amqp_cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    canvas_chaos(amqp_cluster, QUICK, tmp_path, capsys)


@pytest.mark.timeout(120)
def test_worker_dies_after_a_chord_members_commit_before_publishing_the_body_on_redis(
    cluster: Cluster, tmp_path: Path
) -> None:
    member_dies_after_commit_before_publish(cluster, tmp_path)


@pytest.mark.rabbitmq
@pytest.mark.timeout(120)
def test_worker_dies_after_a_chord_members_commit_before_publishing_the_body_on_rabbitmq(
    amqp_cluster: Cluster, tmp_path: Path
) -> None:
    member_dies_after_commit_before_publish(amqp_cluster, tmp_path)


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_canvas_soak_on_redis(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    canvas_chaos(cluster, FULL, tmp_path, capsys)


@pytest.mark.soak
@pytest.mark.rabbitmq
@pytest.mark.timeout(900)
def test_canvas_soak_on_rabbitmq(
    amqp_cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    canvas_chaos(amqp_cluster, FULL, tmp_path, capsys)
