"""One heartbeat thread per worker process beats every run of that process."""

from __future__ import annotations

import os
import threading
import time
import uuid
from contextlib import ExitStack
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, func, select, update

from jobsapp.db import dispose_engines
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.lifecycle.worker.heartbeat import Heartbeat
from jobsapp.maintenance import reaper
from jobsapp.settings import get_settings
from tests.support import tasks
from tests.support.databases import use_database
from tests.support.journal_view import held_by, run_row
from tests.support.waiting import eventually
from tests.support.workers import in_process_worker

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
            conn.execute(
                update(JOBS.table).where(JOBS.table.c.job_id == taken).values(state="queued")
            )
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


def _hold_row_lock(pg: Engine, job_id: uuid.UUID) -> tuple[Connection, datetime]:
    """A second session, idle in transaction, holding the run row's lock (an operator's
    ``SELECT ... FOR UPDATE`` left open); returns it and when it took the lock."""
    holder = pg.connect()
    holder.begin()
    table = JOBS.table
    holder.execute(select(table.c.job_id).where(table.c.job_id == job_id).with_for_update())
    return holder, holder.execute(select(func.now())).scalar_one()


def test_a_locked_run_row_does_not_stall_the_beats_of_the_other_runs(
    pg: Engine, redis_clean: None
) -> None:
    settings = get_settings()
    reaper_cfg = reaper.ReaperConfig(stale_after=timedelta(seconds=settings.stale_after))
    tokens = [f"locked-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    with in_process_worker(concurrency=len(tokens)):
        jobs = [tasks.sleepy.delay(token, 3 * settings.stale_after).job_id for token in tokens]
        eventually(lambda: all(run_row(pg, j)["state"] == "running" for j in jobs), timeout=30)
        locked, others = jobs[0], jobs[1:]
        holder, held_at = _hold_row_lock(pg, locked)
        try:
            # Held past the stale limit, with the reaper passing as beat would: a run whose
            # stamps queued behind the locked one would be reaped and run again.
            end = time.monotonic() + settings.stale_after + 1
            while time.monotonic() < end:
                reaper.run_once(pg, reaper_cfg)
                time.sleep(settings.heartbeat_interval)
            rows = [run_row(pg, j) for j in others]
            assert [(r["state"], r["attempts"]) for r in rows] == [("running", 1)] * len(others)
            # Stamped long after the lock was taken (a ticker stuck on it stops at once).
            since = held_at + timedelta(seconds=settings.stale_after / 2)
            assert all(r["heartbeat_at"] > since for r in rows), rows
        finally:
            holder.rollback()
            holder.close()
        eventually(lambda: all(run_row(pg, j)["state"] == "succeeded" for j in others), timeout=30)
    for job_id, token in zip(others, tokens[1:], strict=True):
        assert run_row(pg, job_id)["attempts"] == 1
        assert tasks.calls(token) == 1


def test_on_sqlite_a_stamp_waits_for_the_write_lock_one_interval_at_most(sqlite_url: str) -> None:
    engine = use_database(sqlite_url)
    job_id = _running(engine)
    beat = _beat(engine, job_id)
    with engine.connect() as writer, writer.begin():  # BEGIN IMMEDIATE: the write lock
        started = time.monotonic()
        assert beat.beat(), "a stamp that could not get the lock is not a lost lease"
        waited = time.monotonic() - started
    assert beat.beats == 0
    assert waited < 5, f"the stamp waited {waited:.1f}s for the write lock"
    assert beat.beat()
    assert beat.beats == 1
