"""Beat's scheduler with a leadership lease: only the leader runs maintenance.

Every tick renews the lease row; a second beat that finds it held stands by (and says
so) until the lease expires, then takes over. Maintenance entries run inside the beat
process, so reaping never waits behind busy workers; other periodic tasks are sent to
the broker as usual, by the leader only.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from datetime import timedelta
from typing import Any

from celery.beat import ScheduleEntry, Scheduler

from jobsapp.db import get_engine, utcnow
from jobsapp.maintenance import lease

log = logging.getLogger(__name__)

LEASE_NAME = "beat"
MAINTENANCE_PREFIX = "jobsapp.maintenance."


def _is_maintenance(entry: ScheduleEntry) -> bool:
    return str(entry.task or "").startswith(MAINTENANCE_PREFIX)


class LeasedScheduler(Scheduler):
    lease_ttl = timedelta(seconds=float(os.environ.get("JOBSAPP_BEAT_LEASE_SECONDS", "30")))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.leading = False
        self._last_standby_log = 0.0
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self._renew():
            return min(1.0, self.lease_ttl.total_seconds() / 4)
        return float(super().tick(*args, **kwargs))

    def _renew(self) -> bool:
        try:
            with get_engine().begin() as conn:
                leading = lease.acquire(conn, LEASE_NAME, self.holder, ttl=self.lease_ttl,
                                        now=utcnow())  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - without the database nobody may lead
            log.warning("beat lease unavailable: %s", type(exc).__name__)
            leading = False
        self._announce(leading)
        return leading

    def _announce(self, leading: bool) -> None:
        if leading and not self.leading:
            log.warning("beat %s is the leader; clearing maintenance backlog", self.holder)
            self._run_all_maintenance()
        if not leading and time.monotonic() - self._last_standby_log > 30:
            log.warning("beat %s standing by: the lease is held by another beat", self.holder)
            self._last_standby_log = time.monotonic()
        self.leading = leading

    def _run_all_maintenance(self) -> None:
        for entry in self.schedule.values():
            if _is_maintenance(entry):
                self._run_inline(entry)

    def _run_inline(self, entry: ScheduleEntry) -> None:
        try:
            self.app.tasks[str(entry.task)]()
        except Exception:
            log.exception("maintenance pass %s failed", entry.task)

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        if _is_maintenance(entry):
            self._run_inline(entry)
            return
        super().apply_entry(entry, producer=producer)

    def close(self) -> None:
        if self.leading:
            with get_engine().begin() as conn:
                lease.release(conn, LEASE_NAME, self.holder)
        super().close()
