"""The fast path's publish marks, written in bulk by one thread per process.

The broker holds a message once ``send_task`` returns; the mark only tells the relay not
to send it again. A lost mark (the process killed before its flush) costs one republish,
which the claim guard absorbs, so ``.delay()`` does not wait for it: each accepted row is
handed here, and a daemon thread marks everything collected with one UPDATE per database
every ``FLUSH_INTERVAL``, and once more when the process exits.

The interval stays far inside the relay's grace (``maintenance.relay.RelayConfig.grace``,
2 s), during which the relay leaves a fresh row to its producer: a row is normally marked
long before the relay could pick it up and send a second copy.

A forked child starts with an empty list and its own thread: its parent's rows are the
parent's to mark.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable, Sequence

from celery.signals import worker_process_shutdown
from sqlalchemy import Engine

from jobsapp import crashpoints
from jobsapp.lifecycle.journal.outbox_queries import Accepted

FLUSH_INTERVAL = 0.05

Write = Callable[[Engine, Sequence[Accepted]], None]


class Marker:
    """Collects accepted rows per engine; ``flush`` writes them (also called at exit).

    From its first row on, it is flushed at interpreter exit and at a Celery child's exit,
    and emptied in a forked child; a process that never publishes registers nothing.
    ``write`` logs its own failures: the thread must outlive a database outage."""

    def __init__(self, write: Write, interval: float = FLUSH_INTERVAL) -> None:
        self._write = write
        self._interval = interval
        self._hooked = False
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        # Held across a whole flush, so the exit flush waits for the thread's one in progress.
        self._flushing = threading.Lock()
        self._wake = threading.Event()
        self._pending: dict[Engine, list[Accepted]] = {}
        self._thread: threading.Thread | None = None

    def add(self, engine: Engine, accepted: Sequence[Accepted]) -> None:
        with self._lock:
            self._pending.setdefault(engine, []).extend(accepted)
            if self._thread is None:
                self._hook_once()
                self._thread = threading.Thread(
                    target=self._loop, name="jobsapp-outbox-marker", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            # Marks of the following interval's publishes join this UPDATE.
            self._wake.clear()
            time.sleep(self._interval)
            self.flush()

    def flush(self) -> int:
        """Mark every collected row; returns how many were handed to the database."""
        with self._flushing:
            with self._lock:
                pending, self._pending = self._pending, {}
            if pending:
                crashpoints.hit("before_publish_mark")
            for engine, accepted in pending.items():
                self._write(engine, accepted)
            return sum(map(len, pending.values()))

    def after_fork_in_child(self) -> None:
        self._reset()

    def _hook_once(self) -> None:
        # A forked child inherits the hooks with the flag: registered once per marker.
        if self._hooked:
            return
        self._hooked = True
        os.register_at_fork(after_in_child=self.after_fork_in_child)
        atexit.register(self.flush)
        # A prefork child leaves with os._exit, past atexit.
        worker_process_shutdown.connect(self._flush_on_child_exit, weak=False)

    def _flush_on_child_exit(self, **_: object) -> None:
        self.flush()
