"""The pulse of a running attempt: a thread stamping ``heartbeat_at`` under the fence."""

from __future__ import annotations

import logging
import threading
import time
import uuid

from sqlalchemy import Engine

from jobsapp import crashpoints
from jobsapp.db import relaxed_autocommit
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.errors import LeaseLost
from jobsapp.lifecycle.registry import RunTable

log = logging.getLogger(__name__)


class Heartbeat:
    """Stamps every ``interval`` seconds until stopped or until the lease is lost.

    A stamp that matches no row means the reaper (or an operator) took the run: the flag
    is raised for the body to check, and the fenced finish will be refused anyway. A
    database error is not a lost lease; the stamp is retried at the next beat. But once no
    stamp has landed for ``stale_after`` (the reaper's limit), the reaper may take the run
    at any moment: the lease counts as lost here too, timed on this process's monotonic
    clock, even while a stamp hangs on an unreachable server.
    """

    def __init__(
        self, engine: Engine, spec: RunTable, job_id: uuid.UUID, attempt: int, interval: float,
        stale_after: float,
    ) -> None:  # fmt: skip
        self._engine = engine
        self._spec = spec
        self._job_id = job_id
        self._attempt = attempt
        self._interval = interval
        self._deadline_after = stale_after
        self._landed = time.monotonic()
        self._stop = threading.Event()
        self._lost = threading.Event()
        self.beats = 0
        self._thread = threading.Thread(
            target=self._loop, name=f"heartbeat-{job_id}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self._interval + 5)

    @property
    def lost(self) -> bool:
        return self._lost.is_set() or self._overdue()

    def check(self) -> None:
        """Raise LeaseLost if another actor has taken this run, or may have."""
        if self._lost.is_set():
            raise LeaseLost(f"job {self._job_id} attempt {self._attempt} lost its lease")
        if self._overdue():
            raise LeaseLost(f"job {self._job_id} attempt {self._attempt}: no heartbeat reached "
                            f"the database for {self._deadline_after:g}s")  # fmt: skip

    def wait(self, seconds: float) -> None:
        """Sleep with the pulse going; wakes early (and raises) if the lease is lost."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self._lost.wait(timeout=min(left, self._interval))
            self.check()

    def _overdue(self) -> bool:
        return time.monotonic() - self._landed > self._deadline_after

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            crashpoints.hit("before_heartbeat")
            if not self._stamp() or self._overdue():
                self._lost.set()
                log.warning("job %s attempt %s: lease lost", self._job_id, self._attempt)
                return

    def _stamp(self) -> bool:
        try:
            with relaxed_autocommit(self._engine) as conn:
                alive = journal.heartbeat(conn, self._spec, self._job_id, self._attempt)
        except Exception as exc:  # noqa: BLE001 - a flaky database is not a lost lease
            log.warning("heartbeat of job %s failed: %s", self._job_id, type(exc).__name__)
            return True
        if alive:
            self.beats += 1
            self._landed = time.monotonic()
        return alive
