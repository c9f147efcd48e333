"""One heartbeat thread per worker process beats every run of that process."""

from __future__ import annotations

import os
import threading
import time
import uuid
from contextlib import ExitStack

from sqlalchemy import Engine, update

from jobsapp.db import dispose_engines
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.heartbeat import Heartbeat
from jobsapp.lifecycle.registry import JOBS
from tests.support import tasks
from tests.support.journal_view import held_by, run_row
from tests.support.waiting import eventually

INTERVAL = 0.1


def _running(pg: Engine) -> uuid.UUID:
    handle = tasks.echo.apply_async((f"hb-{uuid.uuid4()}",))
    with pg.begin() as conn:
        assert journal.claim(conn, JOBS, handle.job_id, 1, worker="w:1")
    return handle.job_id


def _beat(pg: Engine, job_id: uuid.UUID) -> Heartbeat:
    with pg.connect() as conn:
        token = held_by(conn, JOBS, job_id)
    return Heartbeat(pg, JOBS, job_id, 1, interval=INTERVAL, stale_after=30.0, token=token)


def _heartbeat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("heartbeat")]


def test_one_thread_beats_every_run_of_the_process(pg: Engine) -> None:
    jobs = [_running(pg) for _ in range(4)]
    with ExitStack() as runs:
        beats = [runs.enter_context(_beat(pg, job_id)) for job_id in jobs]
        eventually(lambda: all(b.beats >= 3 for b in beats), timeout=20)
        assert len(_heartbeat_threads()) == 1
    assert all(run_row(pg, job_id)["heartbeat_at"] is not None for job_id in jobs)
    # A run that left is no longer stamped; the thread stays for the next run.
    after = [b.beats for b in beats]
    time.sleep(INTERVAL * 5)
    assert [b.beats for b in beats] == after
    assert len(_heartbeat_threads()) == 1


def test_a_lost_lease_stops_only_its_own_run(pg: Engine) -> None:
    taken, kept = _running(pg), _running(pg)
    with _beat(pg, taken) as lost, _beat(pg, kept) as alive:
        with pg.begin() as conn:  # the reaper took it: back to queued
            conn.execute(update(JOBS.table).where(JOBS.table.c.job_id == taken)
                         .values(state="queued"))  # fmt: skip
        eventually(lambda: lost.lost, timeout=20)
        before = alive.beats
        eventually(lambda: alive.beats >= before + 3, timeout=20)
        assert not alive.lost


def test_a_forked_child_beats_with_a_thread_of_its_own(pg: Engine) -> None:
    parent_job, child_job = _running(pg), _running(pg)
    with _beat(pg, parent_job):  # the parent's thread runs while it forks
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit code
            dispose_engines()
            with _beat(pg, child_job) as beat:
                deadline = time.monotonic() + 20
                while beat.beats < 3 and time.monotonic() < deadline:
                    time.sleep(INTERVAL)
            os._exit(0 if beat.beats >= 3 else 1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
