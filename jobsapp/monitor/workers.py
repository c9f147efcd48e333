"""The worker registry: each Celery worker process beats its own ``workers`` row.

Run rows say which process holds a running attempt (``<nodename>:<pid>``), but an idle
worker holds none, and nothing in the journal says which queues a worker consumes. A
thread of the worker's main process writes its row (host, pid, pool, concurrency, the
queues it consumes now) every ``BEAT_SECONDS``; a clean shutdown stamps ``stopped_at``.
A row whose beat is older than ``SILENT_AFTER`` is a worker that went silent (killed,
frozen, cut off from the database). The thread does not depend on Celery's event
heartbeats, which deployments switch off (``--without-heartbeat``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery.signals import worker_ready, worker_shutdown
from sqlalchemy import Connection, Engine, Table, delete, select, update
from sqlalchemy.exc import SQLAlchemyError

from jobsapp.db import get_engine, utcnow
from jobsapp.lifecycle.journal import upsert
from jobsapp.lifecycle.journal.tables import WorkerProcess
from jobsapp.lifecycle.rules.states import State
from jobsapp.monitor.summary import checked_tables

log = logging.getLogger(__name__)

WORKERS: Table = WorkerProcess.__table__  # type: ignore[assignment]
BEAT_SECONDS = 10.0
# Three beats missed: not a slow statement, a worker that stopped beating.
SILENT_AFTER = timedelta(seconds=3 * BEAT_SECONDS)
# The workers page shows processes seen this recently; older rows are deleted at start.
SHOWN_FOR = timedelta(days=1)
KEPT_FOR = timedelta(days=7)
RUNNING_SHOWN = 1000


@dataclass(frozen=True)
class Running:
    module: str
    job_id: uuid.UUID
    task_name: str
    worker: str
    started_at: datetime | None


@dataclass(frozen=True)
class WorkerView:
    name: str
    nodename: str
    host: str
    pid: int
    pool: str
    concurrency: int
    queues: list[str]
    started_at: datetime
    beat_at: datetime
    stopped_at: datetime | None
    silent: bool
    running: list[Running] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.stopped_at is not None:
            return "stopped"
        return "silent" if self.silent else "alive"


# ------------------------------------------------------------------- the writes


@dataclass(frozen=True)
class Identity:
    name: str
    nodename: str
    host: str
    pid: int
    pool: str
    concurrency: int


def beat(conn: Connection, me: Identity, queues: Iterable[str], now: datetime) -> None:
    """Insert or refresh this process's row (a restarted pid is a new row)."""
    values = {"queues": sorted(set(queues)), "beat_at": now, "stopped_at": None}
    stmt = upsert(conn, WORKERS).values(
        name=me.name,
        nodename=me.nodename,
        host=me.host,
        pid=me.pid,
        pool=me.pool,
        concurrency=me.concurrency,
        started_at=now,
        **values,
    )
    conn.execute(stmt.on_conflict_do_update(index_elements=[WORKERS.c.name], set_=values))


def stopped(conn: Connection, name: str, now: datetime) -> None:
    conn.execute(
        update(WORKERS)
        .where(WORKERS.c.name == name, WORKERS.c.stopped_at.is_(None))
        .values(stopped_at=now)
    )


def forget_old(conn: Connection, now: datetime) -> int:
    gone = conn.execute(delete(WORKERS).where(WORKERS.c.beat_at < now - KEPT_FOR))
    return int(gone.rowcount or 0)


class _Beater:
    """The main process's beat thread; a database error skips a beat, never the worker."""

    def __init__(self, engine: Engine, me: Identity, consumer: Any) -> None:
        self._engine, self._me, self._consumer = engine, me, consumer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="worker-registry", daemon=True)

    def start(self) -> None:
        self._write(forget_old)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=BEAT_SECONDS)
        self._write(lambda conn, now: stopped(conn, self._me.name, now))

    def _loop(self) -> None:
        while True:
            self._write(lambda conn, now: beat(conn, self._me, self._queues(), now))
            if self._stop.wait(BEAT_SECONDS):
                return

    def _queues(self) -> list[str]:
        # Read each beat: `celery control add_consumer` changes them at run time.
        consuming = getattr(self._consumer.task_consumer, "queues", None) or []
        return [q.name for q in consuming]

    def _write(self, write: Any) -> None:
        try:
            with self._engine.begin() as conn:
                write(conn, utcnow())
        except SQLAlchemyError as exc:
            log.warning("worker registry not written: %s", type(exc).__name__)


_beaters: list[_Beater] = []


def identity(consumer: Any) -> Identity:
    nodename = str(consumer.hostname or socket.gethostname())
    pool = type(consumer.pool).__module__.rsplit(".", 1)[-1]
    concurrency = int(getattr(consumer.controller, "concurrency", 0) or 0)
    pid = os.getpid()
    return Identity(f"{nodename}:{pid}", nodename, socket.gethostname(), pid, pool, concurrency)


def _on_ready(sender: Any, **_kwargs: Any) -> None:
    beater = _Beater(get_engine(), identity(sender), sender)
    _beaters.append(beater)
    beater.start()


def _on_shutdown(**_kwargs: Any) -> None:
    while _beaters:
        _beaters.pop().stop()


def connect_celery_signals() -> None:
    worker_ready.connect(_on_ready, weak=False, dispatch_uid="jobsapp.workers.ready")
    worker_shutdown.connect(_on_shutdown, weak=False, dispatch_uid="jobsapp.workers.shutdown")


# -------------------------------------------------------------------- the reads


def seen(engine: Engine, now: datetime | None = None) -> list[WorkerView]:
    """Every worker seen in ``SHOWN_FOR``, alive first, with the runs it holds now."""
    now = now or utcnow()
    with engine.connect() as conn:
        views = registered(conn, now)
        running = running_now(conn)
    for run in running:
        holder = holder_of(run, views)
        if holder is not None:
            holder.running.append(run)
    return views


def holder_of(run: Running, views: list[WorkerView]) -> WorkerView | None:
    """The worker process that claimed ``run``: of the processes of its node (a run's
    ``worker`` is ``<nodename>:<pid of the pool child>``, which the registry does not
    know), the last one started before the run was. A worker restarted under the same
    node name after a crash is not given its dead predecessor's runs: those stay with the
    silent process until the reaper frees them."""
    node = run.worker.rpartition(":")[0]
    same_node = [v for v in views if v.nodename == node]
    if run.started_at is not None:
        started = run.started_at
        same_node = [v for v in same_node if v.started_at <= started] or same_node
    return max(same_node, key=lambda v: v.started_at, default=None)


def registered(conn: Connection, now: datetime) -> list[WorkerView]:
    """The workers seen in ``SHOWN_FOR``, alive first (without their runs)."""
    rows = conn.execute(select(WORKERS).where(WORKERS.c.beat_at >= now - SHOWN_FOR)).mappings()
    views = [_view(dict(r), now) for r in rows]
    return sorted(views, key=lambda w: (w.status != "alive", w.nodename, w.pid))


def any_registered(conn: Connection) -> bool:
    return conn.execute(select(WORKERS.c.name).limit(1)).first() is not None


def _view(row: dict[str, Any], now: datetime) -> WorkerView:
    silent = row["stopped_at"] is None and now - row["beat_at"] > SILENT_AFTER
    return WorkerView(**row, silent=silent)


def running_now(conn: Connection) -> list[Running]:
    """Running attempts of every run table (the state index; bounded)."""
    found: list[Running] = []
    for spec in checked_tables(None):
        t = spec.table
        stmt = (
            select(t.c.job_id, t.c.task_name, t.c.worker, t.c.started_at)
            .where(t.c.state == State.RUNNING.value)
            .limit(RUNNING_SHOWN)
        )
        found += [
            Running(spec.module, r.job_id, r.task_name, r.worker or "", r.started_at)
            for r in conn.execute(stmt)
        ]
    return found


def live_queues(conn: Connection, now: datetime) -> set[str] | None:
    """The queues some live worker consumes; None when no worker ever registered (an
    older worker that does not beat its row: nothing can be said)."""
    rows = conn.execute(
        select(WORKERS.c.queues, WORKERS.c.beat_at, WORKERS.c.stopped_at).where(
            WORKERS.c.beat_at >= now - KEPT_FOR
        )
    ).all()
    if not rows:
        return None
    alive = [r.queues for r in rows if r.stopped_at is None and now - r.beat_at <= SILENT_AFTER]
    return {q for queues in alive for q in queues}
