"""JOBSAPP_FINISH_FLUSH=no-wait: a success a PostgreSQL crash lost runs again, once more.

A durable PostgreSQL of the module's own (fsync and synchronous_commit on, as production
runs it; the walwriter flushes only every 10 s, autovacuum off) under two workers and beat.
One gated job at a time: the test reads the WAL insert position while the body waits at its
gate, opens the gate, and once the run is ``succeeded`` freezes every process (SIGSTOP:
no client can commit, so nothing writes the WAL out but the 10 s walwriter) and reads the
write position. Behind the position read before the gate, the success is still in
PostgreSQL's WAL buffers only: the database is SIGKILLed, postmaster and backends, and
started again. (A round whose success a beat tick's synchronous commit flushed meanwhile
is only a success: the next job tries again.)

docs/lifecycle.md says what follows: the run is back to ``running`` under the old claim
(the reaper takes it once it is stale) or, the claim lost too, ``queued`` (the relay's
unclaimed check republishes it); the body runs again and the journal records one success.
With the setting absent the success waits for its flush: the same crash loses nothing.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator, Sequence

import pytest
from sqlalchemy import create_engine, select, text

from jobsapp.db import relaxed_transaction
from jobsapp.lifecycle.journal.registry import JOBS
from tests.chaos.harness import (
    Cluster,
    PrivatePostgres,
    counted_tasks_env,
    private_postgres,
)
from tests.support.procs import Proc, ready
from tests.support.tasks import calls, open_gate

pytestmark = pytest.mark.timeout(180)

# Rounds before the test gives up finding a success left unflushed: a round fails only if
# another commit (a beat tick's, a heartbeat's) wrote the WAL out between the gate and the
# freeze, a window a loaded machine stretches. The first good round ends the loop: more
# rounds cost time only when rounds fail (8 were all spent once in a CI run beside a CPU hog).
ROUNDS = 20
# A cap only: the test opens each body's gate itself.
GATED_SECONDS = 60.0
NO_WAIT = {"JOBSAPP_FINISH_FLUSH": "no-wait"}
RUNS = JOBS.table


@pytest.fixture(scope="module")
def durable_pg() -> Iterator[PrivatePostgres]:
    # The walwriter's longest delay, and no autovacuum (its ANALYZE commits synchronously):
    # while every client is frozen nothing flushes an unflushed commit.
    settings = {"wal_writer_delay": "10s", "autovacuum": "off", "checkpoint_timeout": "1h"}
    with private_postgres(durable=True, settings=settings) as server:
        yield server


def test_a_relaxed_transaction_leaves_nothing_set_on_its_server_connection(
    durable_pg: PrivatePostgres,
) -> None:
    """What a workflow step's or a limited run's no-wait success commits in: the setting
    ends with its transaction, the pooled server connection (PgBouncer shares it) keeps
    synchronous commits."""
    engine = create_engine(durable_pg.url(), pool_size=1, max_overflow=0)
    show = "SELECT current_setting('synchronous_commit'), pg_backend_pid()"
    with relaxed_transaction(engine) as conn:
        setting, backend = conn.exec_driver_sql(show).one()
        assert setting == "off"
    with engine.connect() as conn:
        assert tuple(conn.exec_driver_sql(show).one()) == ("on", backend)
    engine.dispose()


def _start(cluster: Cluster, env: dict[str, str]) -> list[Proc]:
    procs = [cluster.worker(name, env=env) for name in ("w1", "w2")]
    procs.append(cluster.beat())
    ready(*procs, timeout=60)
    return procs


def _signal(procs: Sequence[Proc], signum: signal.Signals) -> None:
    for proc in procs:
        os.killpg(proc.pid, signum)


def _state(cluster: Cluster, job_id: uuid.UUID) -> str:
    with cluster.engine.connect() as conn:
        return str(conn.execute(select(RUNS.c.state).where(RUNS.c.job_id == job_id)).scalar_one())


def _lsn(cluster: Cluster, which: str) -> str:
    with cluster.engine.connect() as conn:
        return str(conn.execute(text(f"SELECT pg_current_wal_{which}_lsn()")).scalar_one())


def _gated_job_running(cluster: Cluster, token: str) -> uuid.UUID:
    (handle,) = cluster.launcher.enqueue(
        {"task": "tests.gated", "kwargs": {"token": token, "seconds": GATED_SECONDS}}
    )
    job_id = uuid.UUID(handle["job_id"])
    cluster.wait_for(lambda: _state(cluster, job_id) == "running", "the job was claimed", 30)
    return job_id


def _succeed_and_freeze(
    cluster: Cluster, procs: Sequence[Proc], job_id: uuid.UUID, token: str
) -> bool:
    """Open the body's gate, freeze every process as soon as the run is ``succeeded``;
    whether the success is certainly not written out of PostgreSQL's WAL buffers (its
    commit record lies behind the insert position read while the body still waited), let
    alone flushed."""
    before = _lsn(cluster, "insert")
    open_gate(token, 1)
    deadline = time.monotonic() + 30
    while _state(cluster, job_id) != "succeeded":
        assert time.monotonic() < deadline, f"job {job_id} did not succeed"
        time.sleep(0.005)
    _signal(procs, signal.SIGSTOP)
    with cluster.engine.connect() as conn:
        # The write position, not the flush: a SIGKILL of PostgreSQL loses what is still in
        # its WAL buffers, while WAL written to the kernel survives (a power loss would not).
        return bool(
            conn.execute(
                text("SELECT pg_current_wal_lsn() < CAST(:lsn AS pg_lsn)"), {"lsn": before}
            ).scalar_one()
        )


def _crash_and_restart(pg: PrivatePostgres, cluster: Cluster, job_id: uuid.UUID) -> str:
    """The run's state as the restarted database has it, read while the processes are
    still frozen (nothing could have run it again yet)."""
    pg.crash()
    pg.start()
    return _state(cluster, job_id)


def _settled(cluster: Cluster, jobs: dict[uuid.UUID, str], twice: uuid.UUID | None) -> None:
    """Each job succeeded once in the journal, by one of the workers; the body of ``twice``
    ran twice, every other once; no run left running or queued."""
    cluster.wait_for(
        lambda: all(_state(cluster, j) == "succeeded" for j in jobs), "every job succeeded", 60
    )
    for job_id, token in jobs.items():
        actors = [e["actor"] for e in cluster.events(job_id) if e["transition"] == "succeed"]
        assert len(actors) == 1, (job_id, cluster.transitions(job_id))
        assert actors[0].split("@", 1)[0] in ("w1", "w2"), actors
        assert calls(token) == (2 if job_id == twice else 1), (job_id, calls(token))
    with cluster.engine.connect() as conn:
        left = conn.execute(select(RUNS.c.job_id).where(RUNS.c.state.in_(("running", "queued"))))
        assert not left.all()


@pytest.mark.serial  # the rounds race beat's ticks; a second test process would stretch them
def test_a_success_lost_in_a_postgres_crash_runs_again_once(
    durable_cluster: Cluster, durable_pg: PrivatePostgres
) -> None:
    cluster = durable_cluster
    procs = _start(cluster, {**counted_tasks_env(), **NO_WAIT})
    jobs: dict[uuid.UUID, str] = {}
    lost, restarted = None, ""
    for _ in range(ROUNDS):
        token = f"lost-success-{uuid.uuid4()}"
        job_id = _gated_job_running(cluster, token)
        jobs[job_id] = token
        if _succeed_and_freeze(cluster, procs, job_id, token):
            lost = job_id
            open_gate(token, 2)  # the run after the crash ends at once
            restarted = _crash_and_restart(durable_pg, cluster, job_id)
            _signal(procs, signal.SIGCONT)
            break
        _signal(procs, signal.SIGCONT)
    assert lost is not None, f"no success was left unflushed in {ROUNDS} rounds: it waited"
    # The crash took the success back: the claim kept (the reaper takes the run once it is
    # stale) or lost too (the relay's unclaimed check republishes it).
    assert restarted in ("running", "queued")
    _settled(cluster, jobs, twice=lost)


def test_by_default_a_success_waits_for_its_flush(
    durable_cluster: Cluster, durable_pg: PrivatePostgres
) -> None:
    cluster = durable_cluster
    procs = _start(cluster, counted_tasks_env())
    token = f"kept-success-{uuid.uuid4()}"
    job_id = _gated_job_running(cluster, token)
    unwritten = _succeed_and_freeze(cluster, procs, job_id, token)
    restarted = _crash_and_restart(durable_pg, cluster, job_id)
    _signal(procs, signal.SIGCONT)
    assert not unwritten, "the success was visible before its flush"
    # Terminal after the restart: neither the reaper nor the relay touches it again.
    assert restarted == "succeeded"
    # The deployment works on after the crash.
    after = f"after-crash-{uuid.uuid4()}"
    again = _gated_job_running(cluster, after)
    open_gate(after, 1)
    _settled(cluster, {job_id: token, again: after}, twice=None)
