"""The pulse of running attempts: one thread per process stamps ``heartbeat_at`` of every
run registered with it, each under its own fence.

A stamp refused because a revoke asked the attempt to stop raises ``CancelRequested`` in
the body's thread (``interruptible``): at its next bytecode once it is back from a blocking
call, as a signal handler would. A run past its hard time limit (``limit``) is ended at a
beat instead of stamped: its ``on_limit`` writes the end, the body hears ``TimeLimitEnded``
the same way, and nothing more is stamped (lifecycle/worker/timeouts.py).

A prefork child runs one job at a time and a threads pool several; either way a run costs
a registration, not a thread started and joined. The thread starts with the first run of a
process and is rebuilt in a forked child (a thread does not survive ``fork``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import Engine

from jobsapp import crashpoints
from jobsapp.db import relaxed_autocommit
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules.errors import CancelRequested, LeaseLost, TimeLimitEnded

log = logging.getLogger(__name__)


class Heartbeat:
    """Stamps every ``interval`` seconds while entered, until the lease is lost.

    A stamp that matches no row means the reaper (or an operator) took the run, or the
    claim ``token`` was lost in a database crash: the flag is raised for the body to
    check, and the fenced finish will be refused anyway. A
    database error is not a lost lease; the stamp is retried at the next beat. But once no
    stamp has landed for ``stale_after`` (the reaper's limit), the reaper may take the run
    at any moment: the lease counts as lost here too, timed on this process's monotonic
    clock, even while a stamp hangs on an unreachable server.
    """

    def __init__(
        self,
        engine: Engine,
        spec: RunTable,
        job_id: uuid.UUID,
        attempt: int,
        interval: float,
        stale_after: float,
        *,
        token: uuid.UUID,
    ) -> None:
        self._engine = engine
        self._spec = spec
        self._job_id = job_id
        self._attempt = attempt
        self._token = token
        self.interval = interval
        self._deadline_after = stale_after
        self._landed = time.monotonic()
        self.due = self._landed + interval
        self._lost = threading.Event()
        self._why_lost = "lost its lease"  # set before _lost: what check() raises
        # Set by the beat before ``_lost``; nothing waits on it, so a flag (one assignment
        # under the GIL), not an Event, which costs each attempt its construction.
        self._cancelled = False
        # The body's thread while it may be interrupted (``interruptible``), under the lock.
        self._body: int | None = None
        self._body_lock = threading.Lock()
        # Whether a CancelRequested was raised into the body's thread. Only then is a pending
        # one cleared at the body's end: CPython (3.11) leaves its eval loop's async-exception
        # signal set after a clear that found nothing pending, and a solo worker so marked
        # stalled under cProfile (bench profile).
        self._raised = False
        self.beats = 0
        # The hard time limit (seconds from __enter__) and what ends the run there.
        self._limit: tuple[float, Callable[[], None]] | None = None
        self._limit_at: float | None = None

    def limit(self, seconds: float, on_limit: Callable[[], None]) -> None:
        """Past ``seconds`` from entering, the next beat calls ``on_limit`` (which ends
        the attempt in the journal) instead of stamping, and the body is interrupted."""
        self._limit = (seconds, on_limit)

    def __enter__(self) -> Heartbeat:
        self._landed = time.monotonic()
        if self._limit is not None:
            self._limit_at = self._landed + self._limit[0]
        self.due = self.next_due(self._landed)
        self._beaten_by = _ticker()  # the same ticker at the exit, with no lookup
        self._beaten_by.add(self)
        return self

    def next_due(self, now: float) -> float:
        """When to beat next: an interval on, or at the time limit if that comes first."""
        due = now + self.interval
        return due if self._limit_at is None else min(due, self._limit_at)

    def __exit__(self, *_exc: object) -> None:
        self._beaten_by.remove(self)

    @property
    def lost(self) -> bool:
        return self._lost.is_set() or self._overdue()

    @property
    def cancelled(self) -> bool:
        """Whether a revoke asked this attempt to stop (as of the last beat)."""
        return self._cancelled

    def check(self) -> None:
        """Raise CancelRequested if a revoke asked this attempt to stop, LeaseLost if
        another actor has taken this run, or may have."""
        if self._cancelled:
            raise CancelRequested(
                f"job {self._job_id} attempt {self._attempt}: a revoke asked it to stop"
            )
        if self._lost.is_set():
            raise LeaseLost(f"job {self._job_id} attempt {self._attempt}: {self._why_lost}")
        if self._overdue():
            raise LeaseLost(f"job {self._job_id} attempt {self._attempt}: {self._overdue_why()}")

    def _overdue_why(self) -> str:
        return f"no heartbeat reached the database for {self._deadline_after:g}s"

    def wait(self, seconds: float) -> None:
        """Sleep with the pulse going; wakes early (and raises) if the lease is lost."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self._lost.wait(timeout=min(left, self.interval))
            self.check()

    def _overdue(self) -> bool:
        return time.monotonic() - self._landed > self._deadline_after

    def beat(self) -> bool:
        """One stamp (called by the ticker); False once the lease is lost."""
        crashpoints.hit("before_heartbeat")
        if self._limit_at is not None and time.monotonic() >= self._limit_at:
            self._end_at_limit()
            return False
        alive = self._stamp()
        overdue = self._overdue()
        if not alive or overdue:
            # The body hears why, whichever of beat() and its own check() sees it first.
            if overdue:
                self._why_lost = self._overdue_why()
            if self._revoked():
                self._cancelled = True
                self._interrupt(CancelRequested)
                log.info("job %s attempt %s: revoked, stopping", self._job_id, self._attempt)
            else:
                log.warning("job %s attempt %s: lease lost", self._job_id, self._attempt)
            self._lost.set()
            return False
        return True

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """While the body runs in this thread, a revoke found by a beat raises
        ``CancelRequested`` in it; none is left pending once the body is done."""
        with self._body_lock:
            self._body = threading.get_ident()
        try:
            if self._cancelled:
                raise CancelRequested()
            yield
        finally:
            with self._body_lock:
                if self._raised:
                    _async_raise(self._body, None)
                    self._raised = False
                self._body = None

    def _end_at_limit(self) -> None:
        """The run is past its hard time limit: end it, stop the body, stamp no more (an
        end that could not be written leaves the run to the reaper, as a stale one)."""
        assert self._limit is not None
        seconds, on_limit = self._limit
        try:
            on_limit()
        except Exception:
            log.exception(
                "job %s attempt %s: the end at the time limit was not written",
                self._job_id,
                self._attempt,
            )
        self._why_lost = f"past its hard time limit ({seconds:g}s)"
        self._lost.set()
        self._interrupt(TimeLimitEnded)

    def _interrupt(self, exc: type[LeaseLost]) -> None:
        with self._body_lock:
            if self._body is not None:
                _async_raise(self._body, exc)
                self._raised = True

    def _revoked(self) -> bool:
        """After a refused stamp: whether a revoke's request refused it (one read, only
        then; the hot stamp stays one statement)."""
        try:
            with relaxed_autocommit(self._engine, bound=self.interval) as conn:
                return journal.cancel_requested(
                    conn, self._spec, self._job_id, self._attempt, token=self._token
                )
        except Exception as exc:  # noqa: BLE001 - the lease is lost either way
            log.warning("revoke check of job %s failed: %s", self._job_id, type(exc).__name__)
            return False

    def _stamp(self) -> bool:
        try:
            # Bounded: the process's one thread stamps every run, and a stamp waiting on a
            # row lock (or a stuck server) would hold back the beats of all the others.
            with relaxed_autocommit(self._engine, bound=self.interval) as conn:
                alive = journal.heartbeat(
                    conn, self._spec, self._job_id, self._attempt, token=self._token
                )
        except Exception as exc:  # noqa: BLE001 - a flaky database is not a lost lease
            log.warning("heartbeat of job %s failed: %s", self._job_id, type(exc).__name__)
            return True
        if alive:
            self.beats += 1
            self._landed = time.monotonic()
        return alive


def _async_raise(thread: int | None, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in ``thread`` at its next bytecode (None: clear one pending)."""
    if thread is not None:
        raised = None if exc is None else ctypes.py_object(exc)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), raised)


class Ticker:
    """The process's heartbeat thread: beats each registered run when it is due.

    Stamps run one after another, each bounded by its run's interval (a lock or statement
    that takes longer fails the stamp): a run whose row is locked misses its beat and
    delays the others by one interval at most. Only reaching an unreachable server is not
    bounded; the runs' local deadline (``Heartbeat._overdue``) counts meanwhile. ``remove``
    waits (a bounded while) for a stamp of that run in flight, so none lands after the
    run left.
    """

    def __init__(self) -> None:
        self._runs: set[Heartbeat] = set()
        self._beating: Heartbeat | None = None
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        # When the waiting thread wakes by itself (0 while it is not waiting): a run due
        # later is met then, so adding it wakes nothing. A wake per run would cost every
        # job a thread switch in a prefork child, which runs one job at a time.
        self._wake_at = 0.0

    def add(self, run: Heartbeat) -> None:
        with self._changed:
            self._runs.add(run)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
                self._thread.start()
            if run.due < self._wake_at:
                self._changed.notify_all()

    def remove(self, run: Heartbeat) -> None:
        with self._changed:
            self._runs.discard(run)
            if self._beating is run:
                # Bounded: a stamp may hang on a dead server, and the run must still finish.
                self._changed.wait_for(lambda: self._beating is not run, timeout=run.interval + 5)

    def _loop(self) -> None:
        while True:
            run = self._next_due()
            alive = True
            try:
                alive = run.beat()
            except Exception:
                log.exception("heartbeat of a run failed")
            with self._changed:
                self._beating = None
                run.due = run.next_due(time.monotonic())
                if not alive:
                    self._runs.discard(run)
                self._changed.notify_all()

    def _next_due(self) -> Heartbeat:
        """Wait until a registered run is due, and mark it as being beaten."""
        with self._changed:
            while True:
                now = time.monotonic()
                nearest = min(self._runs, key=lambda run: run.due, default=None)
                if nearest is not None and nearest.due <= now:
                    self._beating = nearest
                    return nearest
                wait = IDLE_WAKE if nearest is None else nearest.due - now
                self._wake_at = now + wait
                self._changed.wait(timeout=wait)
                self._wake_at = 0.0


# How long the thread waits while no run is registered: a run added meanwhile and due
# later (an interval on: 30 s by default) is added unannounced.
IDLE_WAKE = 1.0
_tickers: dict[int, Ticker] = {}
_tickers_lock = threading.Lock()


def _ticker() -> Ticker:
    """This process's ticker; a forked child builds its own (keyed by pid: the parent's
    thread does not exist in the child)."""
    pid = os.getpid()
    with _tickers_lock:
        ticker = _tickers.get(pid)
        if ticker is None:
            _tickers.clear()
            ticker = _tickers[pid] = Ticker()
        return ticker


def _after_fork_in_child() -> None:
    # The lock may have been held by another thread at the fork: the child's is new.
    global _tickers_lock  # noqa: PLW0603 - replaced once per fork, never shared
    _tickers_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
