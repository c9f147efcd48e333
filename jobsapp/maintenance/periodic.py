"""Periodic lifecycle tasks: a ``beat_schedule`` entry naming a lifecycle task becomes one
journaled job per schedule slot.

Celery's heap sends such an entry whenever its last send is one interval old, so a
failover or a restart sends a slot twice or not at all (celery#1495). Here the leading
beat enqueues every slot due in the catch-up window (``JOBSAPP_BEAT_CATCH_UP_SECONDS``)
with the job id ``periodic_slots.slot_job_id(entry, due)``: a slot another beat, or this one before
a restart, already enqueued is the journal's idempotent duplicate. The slot's job absorbs
repeated enqueues for twice the window after it finished, so not even a finished slot runs
again. docs/periodic.md has the policy and its reasons.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import BaseSchedule, crontab, schedule
from sqlalchemy import Connection, Engine, select

from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.producer import enqueue
from jobsapp.lifecycle.task import LifecycleTask
from jobsapp.maintenance import lease, periodic_slots
from jobsapp.maintenance.periodic_slots import NextAfter
from jobsapp.settings import positive_number

log = logging.getLogger(__name__)

CATCH_UP_ENV = "JOBSAPP_BEAT_CATCH_UP_SECONDS"
DEFAULT_CATCH_UP_SECONDS = 300.0
# Slots one entry enqueues per tick: a long window of a fine schedule drains over ticks.
SLOTS_PER_TICK = 500
# Entry options a slot's job honours; anything else is refused when beat starts.
# ``catch_up``: enqueue every missed slot of the window, not only the latest (the default,
# as Celery runs a missed entry once).
OPTIONS = frozenset({"queue", "priority", "catch_up"})
# How far back the admin looks for an entry's last slot, in slots and in time.
LOOKBACK_SLOTS = 500
LOOKBACK = timedelta(days=8)
CRON_GRAIN = timedelta(minutes=1)


def catch_up_from_env(env: Mapping[str, str]) -> timedelta:
    return timedelta(seconds=positive_number(env, CATCH_UP_ENV, DEFAULT_CATCH_UP_SECONDS))


@dataclass(frozen=True)
class PeriodicEntry:
    """A beat entry whose slots are lifecycle jobs."""

    name: str
    task: LifecycleTask
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    options: Mapping[str, Any]
    # Celery's own description of the schedule, for logs and the admin.
    schedule: str
    next_after: NextAfter
    # The shortest gap between two slots: bounds the admin's look back.
    grain: timedelta


def _cron(cron: crontab) -> NextAfter:
    def next_after(moment: datetime) -> datetime:
        base, delta, _now = cron.remaining_delta(periodic_slots.utc(moment))
        return periodic_slots.utc(base + delta)

    return next_after


def _timing(name: str, task: str, when: BaseSchedule | None) -> tuple[NextAfter, timedelta]:
    """The entry's slots; only schedules whose due times every beat can derive alike."""
    # Exact types: a subclass may redefine when it is due, which slots cannot follow.
    if type(when) is crontab:
        return _cron(when), CRON_GRAIN
    if type(when) is schedule:
        period = timedelta(seconds=when.seconds)
        return periodic_slots.every(period), period
    raise ValueError(
        f"beat entry {name!r} names lifecycle task {task}: its schedule "
        f"{when!r} is not an interval or a crontab"
    )


_UNITS = ((86400, "day"), (3600, "h"), (60, "min"), (1, "s"))


def described(when: BaseSchedule | None) -> str:
    """A schedule as an operator reads it: ``every 30 s``, ``every 5 min``, ``crontab 0 2
    * * *`` (minute hour day month weekday), instead of Celery's ``<freq: 30.00 seconds>``."""
    if type(when) is schedule:
        seconds = when.seconds
        for size, unit in _UNITS:
            if seconds >= size and seconds % size == 0:
                return f"every {seconds // size:g} {unit}"
        return f"every {seconds:g} s"
    if type(when) is crontab:
        fields = repr(when).removeprefix("<crontab: ").split(" (", 1)[0]
        return f"crontab {fields}"
    return str(when)


def periodic_entry(app: Celery, entry: ScheduleEntry) -> PeriodicEntry | None:
    """``entry`` as a periodic lifecycle entry; None if its task is not a lifecycle task
    (Celery sends it as usual). ValueError for what its slots cannot honour."""
    name, options = str(entry.name), dict(entry.options or {})
    task = app.tasks.get(entry.task) if entry.task else None
    if not isinstance(task, LifecycleTask):
        return None
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise ValueError(
            f"beat entry {name!r}: lifecycle slots take the options "
            f"{sorted(OPTIONS)}, not {unknown}"
        )
    next_after, grain = _timing(name, task.name, entry.schedule)
    return PeriodicEntry(
        name,
        task,
        tuple(entry.args or ()),
        dict(entry.kwargs or {}),
        options,
        described(entry.schedule),
        next_after,
        grain,
    )


def enqueue_slot(app: Celery, entry: PeriodicEntry, due: datetime, window: timedelta) -> JobHandle:
    """The slot's job, enqueued through the journal (idempotent by its derived job id)."""
    job = entry.task.new_job(entry.args, entry.kwargs, periodic_slots.slot_job_id(entry.name, due))
    queue, priority = entry.options.get("queue"), entry.options.get("priority")
    # A slot is enqueued at most ``window`` after it was due: a finished slot job must
    # absorb enqueues that long; twice leaves room for a slow tick.
    job = replace(
        job,
        dedup_window=max(job.dedup_window, 2 * window),
        queue=queue or job.queue,
        priority=job.priority if priority is None else priority,
    )
    return enqueue.enqueue(app, job)


class Periodic:
    """The leading beat's slots: what it enqueued, per entry, while it leads."""

    def __init__(self, app: Celery, entries: Sequence[PeriodicEntry], window: timedelta) -> None:
        self.app, self.entries, self.window = app, tuple(entries), window
        self._last: dict[str, datetime] = {}

    def forget(self) -> None:
        """On a change of leader: the other beat's slots are known only to the journal."""
        self._last.clear()

    def run_due(self, engine: Engine) -> float:
        """Enqueue every entry's due slots; seconds until the next slot is due."""
        if not self.entries:
            return float("inf")
        try:
            with engine.connect() as conn:
                now = lease.database_now(conn)
        except Exception as exc:  # noqa: BLE001 - no clock, no slots: try at the next tick
            log.warning("periodic slots: database unavailable: %s", type(exc).__name__)
            return 1.0
        for entry in self.entries:
            self._run_entry(entry, now)
        return min((e.next_after(now) - now).total_seconds() for e in self.entries)

    def _run_entry(self, entry: PeriodicEntry, now: datetime) -> None:
        catch_up = bool(entry.options.get("catch_up"))
        plan = periodic_slots.plan(
            entry.next_after,
            last=self._last.get(entry.name),
            now=now,
            window=self.window,
            limit=SLOTS_PER_TICK,
            catch_up=catch_up,
        )
        if plan.superseded:
            log.info(
                "periodic %s: %d missed slots run once, as the latest (set the entry's "
                "option catch_up=True to run each)",
                entry.name,
                plan.superseded,
            )
        if plan.skipped:
            log.warning(
                "periodic %s: slots from %s until %s are older than the catch-up "
                "window (%s); skipped",
                entry.name,
                *plan.skipped,
                self.window,
            )
        for due in plan.due:
            try:
                handle = enqueue_slot(self.app, entry, due, self.window)
            except Exception:
                # The slot stays due: the next tick tries it again while it is in the window.
                log.exception("periodic %s: slot %s not enqueued", entry.name, due.isoformat())
                return
            self._last[entry.name] = due
            log.info(
                "periodic %s: slot %s -> job %s %s",
                entry.name,
                due.isoformat(),
                handle.job_id,
                handle.outcome,
            )


# --------------------------------------------------------------------- admin view


@dataclass(frozen=True)
class LastSlot:
    due: datetime
    job_id: uuid.UUID
    module: str
    state: str


@dataclass(frozen=True)
class EntryView:
    """One line of the admin's periodic table; ``problem``: why beat refuses the entry."""

    name: str
    task: str
    schedule: str
    last: LastSlot | None = None
    next: datetime | None = None
    problem: str | None = None


def overview(engine: Engine, app: Celery) -> list[EntryView]:
    """The periodic lifecycle entries of ``app.conf.beat_schedule``: last and next slot."""
    # The web and CLI processes know the tasks only once the worker's imports are loaded.
    app.loader.import_default_modules()
    with engine.connect() as conn:
        now = lease.database_now(conn)
        views = (
            _view(conn, app, name, spec, now)
            for name, spec in (app.conf.beat_schedule or {}).items()
        )
        return [view for view in views if view is not None]


def _view(
    conn: Connection, app: Celery, name: str, spec: Mapping[str, Any], now: datetime
) -> EntryView | None:
    entry = ScheduleEntry(**dict(spec, name=name, app=app))
    try:
        found = periodic_entry(app, entry)
    except ValueError as refused:
        return EntryView(name, str(entry.task), described(entry.schedule), problem=str(refused))
    if found is None:
        return None
    return EntryView(
        name, found.task.name, found.schedule, last_slot(conn, found, now), found.next_after(now)
    )


def last_slot(conn: Connection, entry: PeriodicEntry, now: datetime) -> LastSlot | None:
    """The latest of the entry's recent slots that the journal holds."""
    span = min(LOOKBACK, entry.grain * LOOKBACK_SLOTS)
    due = periodic_slots.recent(entry.next_after, now=now, span=span, limit=LOOKBACK_SLOTS)
    by_id = {periodic_slots.slot_job_id(entry.name, d): d for d in due}
    found = _states(conn, entry, by_id)
    if not found:
        return None
    job_id = max(found, key=by_id.__getitem__)
    return LastSlot(by_id[job_id], job_id, entry.task.run_table.module, found[job_id])


def _states(
    conn: Connection, entry: PeriodicEntry, ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, str]:
    table = entry.task.run_table.table
    rows = conn.execute(select(table.c.job_id, table.c.state).where(table.c.job_id.in_(list(ids))))
    return {uuid.UUID(str(r.job_id)): str(r.state) for r in rows}
