"""Beat's scheduler with a leadership lease: only the leader runs maintenance.

Every tick renews the lease row; a second beat that finds it held stands by (and says
so) until the lease expires, then takes over. Maintenance entries run inside the beat
process, so reaping never waits behind busy workers; other periodic tasks are sent to
the broker as usual, by the leader only. A long pass renews the lease between its
batches and stops as soon as the lease is lost (``maintenance.budget``).

Cadences of the maintenance entries can be set per deployment without touching
``celeryconfig.py``: ``JOBSAPP_REAPER_EVERY``, ``JOBSAPP_RELAY_EVERY``,
``JOBSAPP_RETENTION_EVERY``, ``JOBSAPP_STAGING_EVERY`` and ``JOBSAPP_RECONCILE_EVERY``
(seconds). ``JOBSAPP_BEAT_LEASE_SECONDS`` is the lease.

An entry naming a lifecycle task is not Celery's to send: the leader enqueues one job per
schedule slot (``maintenance.periodic``), so a failover neither repeats nor drops a slot.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import schedule
from sqlalchemy.exc import DBAPIError

from jobsapp import preflight
from jobsapp.db import get_engine
from jobsapp.maintenance import budget, entries, lease, periodic
from jobsapp.maintenance.entries import MAINTENANCE_PREFIX
from jobsapp.settings import SettingsError, get_settings, optional_number, positive_number

log = logging.getLogger(__name__)

LEASE_NAME = "beat"
LEASE_ENV = "JOBSAPP_BEAT_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 30.0
# Keyed by task name, not entry name: a deployment may rename entries in its config.
CADENCE_ENV: Mapping[str, str] = {
    "jobsapp.maintenance.reaper": "JOBSAPP_REAPER_EVERY",
    "jobsapp.maintenance.relay": "JOBSAPP_RELAY_EVERY",
    "jobsapp.maintenance.retention": "JOBSAPP_RETENTION_EVERY",
    "jobsapp.maintenance.staging": "JOBSAPP_STAGING_EVERY",
    "jobsapp.maintenance.reconcile": "JOBSAPP_RECONCILE_EVERY",
}
# The standby logs at most this often, so a long wait does not flood the log.
STANDBY_LOG_EVERY = 30.0


def report_line(task: str, report: object) -> str | None:
    """A pass's report as one line an operator reads (``maintenance reaper: jobs=2``), or
    None when the pass found nothing to do: the relay runs every two seconds, and a line
    per idle pass would bury the ones that say something."""
    counts = report if isinstance(report, Mapping) else {"result": report}
    done = [f"{name}={value}" for name, value in counts.items() if value]
    if not done:
        return None
    return f"maintenance {task.removeprefix(MAINTENANCE_PREFIX)}: {', '.join(done)}"


def cadence_overrides(env: Mapping[str, str]) -> dict[str, timedelta]:
    """Maintenance cadences set in ``env``, by task name."""
    found: dict[str, timedelta] = {}
    for task, name in CADENCE_ENV.items():
        seconds = optional_number(env, name)
        if seconds is not None:
            found[task] = timedelta(seconds=seconds)
    return found


def maintenance_task(entry: ScheduleEntry) -> str | None:
    """The entry's task name if it is a maintenance pass (run inline), else None."""
    task = entry.task
    return task if task is not None and task.startswith(MAINTENANCE_PREFIX) else None


def _read_pass_variables() -> None:
    """The cadences and the passes' own variables; raises SettingsError for a bad one."""
    from jobsapp.maintenance import beat_tasks

    cadence_overrides(os.environ)
    for config in (beat_tasks.reaper_config, beat_tasks.relay_config, beat_tasks.staging_config):
        config()


def lease_ttl_from_env(env: Mapping[str, str]) -> timedelta:
    return timedelta(seconds=positive_number(env, LEASE_ENV, DEFAULT_LEASE_SECONDS))


class LeasedScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Read per instance (not at import) so a bad value fails the beat that uses it, at
        # its start (Celery builds the scheduler for its banner) rather than at every pass.
        try:
            self.lease_ttl = lease_ttl_from_env(os.environ)
            self.catch_up = periodic.catch_up_from_env(os.environ)
            _read_pass_variables()
        except SettingsError as bad:
            preflight.exit_on_bad_setting(bad)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.periodic: periodic.Periodic | None = None
        self.leading = False
        self._ticking = False
        self._last_standby_log: float | None = None
        budget.guard_with(self._still_leading)
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        # ``app.conf.beat_schedule = {...}`` after the app was built replaces the merged
        # setting: the maintenance entries are merged back before Celery reads it.
        from jobsapp.celery_app import shipped_settings

        try:
            self.app.conf.beat_schedule = entries.with_maintenance(
                shipped_settings()["beat_schedule"], self.app.conf.beat_schedule or {}
            )
        except SettingsError as bad:
            preflight.exit_on_bad_setting(bad)
        super().setup_schedule()
        overrides = cadence_overrides(os.environ)
        for entry in self.schedule.values():
            task = maintenance_task(entry)
            every = overrides.get(task) if task else None
            if task and every is not None:
                entry.schedule = schedule(every, app=self.app)
                log.info(
                    "beat: %s every %gs (from %s)", task, every.total_seconds(), CADENCE_ENV[task]
                )
        self._take_periodic_entries()

    def _take_periodic_entries(self) -> None:
        """Lifecycle entries leave Celery's heap: their slots are enqueued by ``periodic``."""
        self.app.loader.import_default_modules()
        found = [periodic.periodic_entry(self.app, entry) for entry in self.schedule.values()]
        entries = [entry for entry in found if entry is not None]
        for entry in entries:
            del self.schedule[entry.name]
            log.info(
                "beat: %s enqueues %s once per slot of %s",
                entry.name,
                entry.task.name,
                entry.schedule,
            )
        self.periodic = periodic.Periodic(self.app, entries, self.catch_up)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        self._ticking = True
        try:
            return self._tick(*args, **kwargs)
        finally:
            self._ticking = False

    def _tick(self, *args: Any, **kwargs: Any) -> float:
        # Renewal must come well inside the lease, whatever the schedule's own interval.
        renew_every = self.lease_ttl.total_seconds() / 3
        if not self._renew():
            return min(1.0, renew_every)
        until_slot = self.periodic.run_due(get_engine()) if self.periodic else renew_every
        return min(float(super().tick(*args, **kwargs)), renew_every, max(until_slot, 0.0))

    def _renew(self) -> bool:
        leading = self._renew_lease()
        self._announce(leading)
        return leading

    def _renew_lease(self) -> bool:
        try:
            with get_engine().begin() as conn:
                return lease.acquire(
                    conn, LEASE_NAME, self.holder, ttl=self.lease_ttl, now=lease.database_now(conn)
                )
        except Exception as exc:  # noqa: BLE001 - without the database nobody may lead
            log.warning("beat lease unavailable: %s", type(exc).__name__)
            return False

    def _still_leading(self) -> bool:
        """Between the batches of a pass: renew, and stop the pass if the lease is gone."""
        if self._renew_lease():
            return True
        self._announce(False)
        return False

    def _announce(self, leading: bool) -> None:
        if leading != self.leading and self.periodic:
            self.periodic.forget()
        if leading and not self.leading:
            log.warning("beat %s is the leader; clearing maintenance backlog", self.holder)
            self.leading = True
            self._run_all_maintenance()
        if not leading:
            if self.leading:
                log.warning("beat %s lost the lease; standing by", self.holder)
            now = time.monotonic()
            if self._last_standby_log is None or now - self._last_standby_log > STANDBY_LOG_EVERY:
                log.warning("%s", standby_line(self.holder, LEASE_NAME))
                self._last_standby_log = now
        self.leading = leading

    def _run_all_maintenance(self) -> None:
        for entry in self.schedule.values():
            task = maintenance_task(entry)
            if task:
                self._run_inline(task, entry)

    def _run_inline(self, task: str, entry: ScheduleEntry) -> None:
        try:
            report = self.app.tasks[task]()
        except Exception:
            log.exception("maintenance pass %s failed", task)
            return
        self._stamp(task, entry)
        line = report_line(task, report)
        if line is not None:
            log.info("%s", line)

    # Celery's cached producer connects, retrying for minutes while the broker is down, for
    # every due entry (inline passes too): the reaper would stall behind it. Without it,
    # a broker-bound entry publishes through the app's pool like any apply_async.
    producer = None  # type: ignore[assignment]

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        task = maintenance_task(entry)
        if task:
            self._run_inline(task, entry)
            return
        super().apply_entry(entry, producer=producer)

    def _stamp(self, task: str, entry: ScheduleEntry) -> None:
        """The pass ran: ``jobsapp maintenance leader`` reports it overdue once its next
        run is later than its cadence plus the lease (the time a standby needs to take over)."""
        when = entry.schedule
        if when is None:
            return
        cadence = timedelta(seconds=when.is_due(when.now())[1])
        try:
            with get_engine().begin() as conn:
                lease.stamp(
                    conn,
                    lease.STAMP_PREFIX + task,
                    self.holder,
                    now=lease.database_now(conn),
                    ttl=cadence + self.lease_ttl,
                )
        except DBAPIError as exc:  # the next pass stamps again; the check allows for it
            log.warning("maintenance pass %s not stamped: %s", task, type(exc).__name__)

    def close(self) -> None:
        # Celery's SIGTERM and SIGINT handler closes the scheduler inside the handler, then
        # raises SystemExit: during a tick the release would wait on the pass's own open
        # transaction (SQLite's busy timeout; on PostgreSQL the lease's row, for ever). Beat's
        # loop closes again once the SystemExit has ended that transaction.
        if self._ticking:
            return
        if self.leading:
            self.leading = False
            try:
                with get_engine().begin() as conn:
                    lease.release(conn, LEASE_NAME, self.holder)
            except Exception as exc:  # noqa: BLE001 - the lease then simply expires
                log.warning("beat lease not released: %s", type(exc).__name__)
        super().close()


def standby_line(me: str, lease_name: str) -> str:
    """What a beat that does not lead says: who holds the lease, or that the database is
    out of reach (then nobody can be known to lead). One query, at the standby log's pace."""
    settings = get_settings()
    try:
        with get_engine().connect() as conn:
            held, now = lease.holder_of(conn, lease_name), lease.database_now(conn)
    except DBAPIError as exc:
        where, why = preflight.database_setting(settings.database_url), preflight.reason_of(exc)
        return f"beat {me} standing by: cannot reach the database at {where}: {why}"
    if held is None or held[1] <= now:
        return f"beat {me} standing by: the lease is free; taking it on the next tick"
    return f"beat {me} standing by: the lease is held by beat {held[0]} until {held[1]:%H:%M:%S}Z"
