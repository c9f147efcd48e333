"""Autocommit connections a thread keeps checked out between its statements (PostgreSQL).

A worker's job makes two one-statement writes (the claim, the finish) and a producer's
``.delay()`` one; checking a connection out of SQLAlchemy's pool and back in for each
costs about 130 Python calls, more than a third of the Python a job adds to Celery's. An
autocommit connection carries no transaction between statements, so a thread may keep
one: it is the pool's connection all the same (the server sees no more sessions than a
pool of the same size keeps open), only not handed back in between.

What keeps that as safe as a checkout per statement:
- one per thread, at most ``pool_size`` per engine; a thread beyond that, or one that
  asks again while its own is in use (a nested statement), checks out as before;
- a connection SQLAlchemy invalidated (a lost server) is let go at the block's end, and
  an invalidation anywhere in the pool (SQLAlchemy's sign that the server went away)
  lets every thread's go at its next use, as the pool recycles its idle connections;
- a forked child never touches what its parent held: a holding belongs to a process id,
  and one of another process is kept referenced, unused, so that nothing closes the
  parent's socket from the child (as ``Engine.dispose(close=False)`` leaves the pool);
- ``Engine.dispose()`` lets every holding of the process go at its next use, and a dead
  thread's holding is closed when a new thread needs its place.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from sqlalchemy import Connection, Engine, event


class Holding:
    """One thread's connection, entered as ``with holding as conn``."""

    __slots__ = ("busy", "conn", "generation", "pid")

    def __init__(self, conn: Connection, generation: int) -> None:
        self.conn = conn
        self.generation = generation
        self.pid = os.getpid()
        self.busy = False

    def __enter__(self) -> Connection:
        self.busy = True
        return self.conn

    def __exit__(self, *_exc: object) -> None:
        self.busy = False
        if self.conn.invalidated:
            self.conn.close()


class Holder:
    """The holdings of one engine's threads."""

    def __init__(self, engine: Engine, cap: int) -> None:
        self.engine = engine
        self._cap = cap
        # By thread object, not id: an ended thread's id is soon another's.
        self._held: dict[threading.Thread, Holding] = {}
        self._lock = threading.Lock()
        self._generation = 0
        # Kept referenced so that garbage collection never closes a parent's socket.
        self._parents: list[Holding] = []
        event.listen(engine, "invalidate", self._stale)
        event.listen(engine, "engine_disposed", self._stale)
        _holders.add(self)

    def after_fork_in_child(self) -> None:
        # A parent's thread may have held the lock as it forked; it has no thread here.
        self._lock = threading.Lock()

    def _stale(self, *_args: Any) -> None:
        self._generation += 1

    def use(self) -> Holding | Connection:
        """This thread's connection, or a checkout of its own (closed at the block's end)."""
        held = self._held.get(threading.current_thread())
        if (
            held is not None
            and not held.busy
            and held.generation == self._generation
            and held.pid == os.getpid()
            and not held.conn.closed
        ):
            return held
        return self._renewed(held)

    def _renewed(self, held: Holding | None) -> Holding | Connection:
        if held is not None and held.busy:
            return self.engine.connect()  # a nested statement: a checkout of its own
        me = threading.current_thread()
        if held is not None:
            with self._lock:
                self._let_go(me, held)
        # Connected outside the lock: a server that does not answer holds up this thread
        # only, not every other thread's renewal.
        generation = self._generation
        conn = self.engine.connect()
        with self._lock:
            if len(self._held) >= self._cap:
                self._sweep()
            if len(self._held) >= self._cap:
                return conn
            fresh = self._held[me] = Holding(conn, generation)
            return fresh

    def _let_go(self, thread: threading.Thread, held: Holding) -> None:
        if self._held.get(thread) is held:  # a sweep in another thread may have been first
            del self._held[thread]
        if held.pid != os.getpid():
            self._parents.append(held)
        else:
            held.conn.close()

    def _sweep(self) -> None:
        """Close the holdings of threads that ended, and forget a parent's."""
        for thread, held in list(self._held.items()):
            if held.pid != os.getpid() or not thread.is_alive():
                self._let_go(thread, held)


_holders: weakref.WeakSet[Holder] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for holder in list(_holders):
        holder.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
