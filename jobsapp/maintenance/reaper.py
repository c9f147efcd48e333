"""The reaper: frees runs whose heartbeat went stale (a dead or frozen worker), and
expires queued runs past their ``expires_at`` whose message no worker took in time.

Per run table: requeue while attempts and rescues remain, else fail with ``stale``.
The decision is pure; each run is written by one guarded statement in a savepoint of its
batch's transaction, so a run whose domain row is locked is skipped, not a wall. After the batch
commits, the reaper publishes the requeued attempts' messages itself (given an app),
as a producer does after its COMMIT; whatever that misses, the relay publishes.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from celery import Celery
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import OperationalError

from jobsapp.db import lock_refused
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import StaleRun, registry
from jobsapp.lifecycle.journal.registry import RunTable, StalePolicy
from jobsapp.lifecycle.rules.message import task_id_for
from jobsapp.lifecycle.rules.states import Transition
from jobsapp.lifecycle.transport import outbox, publisher
from jobsapp.lifecycle.worker import celery_view
from jobsapp.maintenance import lease, relay
from jobsapp.maintenance.budget import DEFAULT_BUDGET, Budget, for_pass

log = logging.getLogger(__name__)

# How long the reaper waits for one row lock before it skips that run until the next tick.
LOCK_TIMEOUT_MS = 1000


@dataclass(frozen=True)
class ReaperConfig:
    stale_after: timedelta
    batch: int = 200
    max_batches: int = 20
    # The check interval given to the messages the reaper publishes (see outbox).
    unclaimed_after: timedelta = outbox.UNCLAIMED_AFTER
    budget: timedelta = DEFAULT_BUDGET

    def __post_init__(self) -> None:
        if self.stale_after <= timedelta(0) or self.batch < 1 or self.max_batches < 1:
            raise ValueError("reaper needs a positive stale limit, batch and batch count")


def should_requeue(run: StaleRun, spec: RunTable) -> bool:
    """Requeue only under a requeue policy, with attempts and rescues to spare, and never a
    run a revoke asked to stop (it fails cancelled)."""
    return not run.cancel_requested and spec.requeues_stale(
        run.attempt, run.max_attempts, run.rescues
    )


def reason_for(run: StaleRun, spec: RunTable, stale_after: timedelta) -> str:
    """The record kept in ``last_error`` and ``job_events``; one per kind of decision."""
    base = f"heartbeat older than {stale_after.total_seconds():g}s: the worker died or froze"
    if should_requeue(run, spec):
        return f"{base}; requeued"
    if run.cancel_requested:
        return f"{base}; a revoke had asked it to stop: cancelled"
    if spec.stale_policy is StalePolicy.FAIL:
        return f"{base}; this run table fails stale runs"
    if run.rescues >= spec.rescue_limit:
        return f"{base}; rescued {spec.rescue_limit} times already: a job that kills its worker"
    return f"{base}; no attempts left"


@dataclass(frozen=True)
class _Batch:
    found: int
    reaped: int
    requeued: list[tuple[uuid.UUID, int]]
    blocked: list[uuid.UUID]
    # Each reaped run and what the reaper recorded of it, for Celery's task events.
    ended: list[tuple[StaleRun, str]] = field(default_factory=list)


def _reap_one(
    conn: Connection,
    spec: RunTable,
    run: StaleRun,
    cfg: ReaperConfig,
    cutoff: datetime,
    now: datetime,
) -> bool | None:
    """Reap ``run`` in a savepoint; None when a row it must touch is locked."""
    requeue_it = should_requeue(run, spec)
    reason = reason_for(run, spec, cfg.stale_after)
    try:
        with conn.begin_nested():
            done = journal.reap(
                conn, spec, [run], requeue_them=requeue_it, cutoff=cutoff, reason=reason, now=now
            )
    except OperationalError as exc:
        if not lock_refused(exc):
            raise
        return None
    return bool(done)


def _reap_table(
    engine: Engine, spec: RunTable, cfg: ReaperConfig, skip: Collection[uuid.UUID]
) -> _Batch:
    with engine.begin() as conn:
        # The database's clock, as the workers' heartbeats are judged by (beat's may drift).
        now = lease.database_now(conn)
        cutoff = now - cfg.stale_after
        if conn.dialect.name == "postgresql":
            # A frozen process holding a domain row (an attachment) must not stall beat:
            # that run is skipped for this pass, each run in its own savepoint.
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'")
        stale = journal.find_stale(conn, spec, cutoff=cutoff, limit=cfg.batch, skip=skip)
        reaped: list[StaleRun] = []
        blocked: list[uuid.UUID] = []
        for run in stale:
            done = _reap_one(conn, spec, run, cfg, cutoff, now)
            if done is None:
                blocked.append(run.job_id)
            elif done:
                reaped.append(run)
    requeued = [(r.job_id, r.attempt + 1) for r in reaped if should_requeue(r, spec)]
    ended = [(r, reason_for(r, spec, cfg.stale_after)) for r in reaped]
    return _Batch(
        found=len(stale), reaped=len(reaped), requeued=requeued, blocked=blocked, ended=ended
    )


# The task event of each end the reaper records: Flower's state of the attempt is the
# journal's (a revoked run's end, cancelled, reads REVOKED as when its worker ends it).
_LOST = {Transition.REAP_REQUEUE: "task-retried", Transition.REAP_FAIL: "task-failed"}


def _tell_celery(app: Celery, spec: RunTable, ended: list[tuple[StaleRun, str]]) -> None:
    """Each reaped attempt's end as Celery's own task event (``_event``), so Flower shows
    the attempt of a killed worker ended, not STARTED for good. A live view: a failed
    publish loses nothing, and the events go through the bounded producer
    (``JOBSAPP_PUBLISH_TIMEOUT``), not at all while the broker is known to be down, so a
    silent broker never stalls the reaper."""
    if not ended or not publisher.fast_path_open():
        return
    try:
        with publisher.producer(app) as pooled:
            dispatcher = app.events.Dispatcher(
                pooled.connection,
                hostname=f"jobsapp-reaper@{socket.gethostname()}",
                buffer_while_offline=False,
            )
            try:
                for run, reason in ended:
                    name, fields = _event(
                        journal.ended_by(run, requeued=should_requeue(run, spec)), reason
                    )
                    dispatcher.send(
                        name, uuid=task_id_for(run.job_id, run.attempt), retry=False, **fields
                    )
            finally:
                dispatcher.close()
    except publisher.BROKER_ERRORS as down:
        publisher.broker_failed()
        log.info("reaper: task events not sent: %s", type(down).__name__)


def _event(end: Transition, reason: str) -> tuple[str, Mapping[str, object]]:
    """Celery's event of ``end``: a revoke's, or the lost worker's error."""
    if end is Transition.CANCEL:
        return celery_view.revoked(expired=False)
    said = f"WorkerLostError('{reason}')"
    return _LOST[end], {"exception": said, "traceback": said}


def _reap_module(
    engine: Engine, spec: RunTable, cfg: ReaperConfig, app: Celery | None, budget: Budget
) -> tuple[int, int]:
    """(reaped, published) for one run table, batch after batch within the budget."""
    total = published = 0
    blocked: set[uuid.UUID] = set()
    for _ in range(cfg.max_batches):
        try:
            batch = _reap_table(engine, spec, cfg, blocked)
        except OperationalError as exc:
            log.warning(
                "reaper: %s batch gave up (%s); next tick retries",
                spec.module,
                type(exc.orig).__name__,
            )
            break
        total += batch.reaped
        blocked.update(batch.blocked)
        if app is not None:
            published += relay.publish_rows(
                app, engine, spec, batch.requeued, unclaimed_after=cfg.unclaimed_after
            )
            _tell_celery(app, spec, batch.ended)
        # Count what was found, not reaped: a row another reaper took meanwhile
        # still means the backlog may go on.
        if batch.found < cfg.batch or not budget.allows_more():
            break
    if blocked:
        log.warning(
            "reaper: %s: %d stale runs skipped, a row they need is locked; next tick retries",
            spec.module,
            len(blocked),
        )
    return total, published


def _expire_module(engine: Engine, spec: RunTable, cfg: ReaperConfig) -> int:
    """One batch of queued runs past their expiry; a worker that gets their message would
    expire them too, but a message may never come (a broker that lost it, no worker)."""
    try:
        with engine.begin() as conn:
            expired = journal.expire_due(conn, spec, limit=cfg.batch, actor="reaper")
    except OperationalError as exc:
        log.warning(
            "reaper: %s expiry gave up (%s); next tick retries",
            spec.module,
            type(exc.orig).__name__,
        )
        return 0
    if expired:
        log.info("reaper: %s: %d queued jobs expired", spec.module, expired)
    return expired


def run_once(
    engine: Engine, cfg: ReaperConfig, app: Celery | None = None, budget: Budget | None = None
) -> dict[str, int]:
    """One bounded pass over every run table; returns reaped counts per module.

    With ``app`` the requeued attempts are published right after each batch commits.
    """
    budget = budget or for_pass(cfg.budget)
    counts: dict[str, int] = {}
    published = 0
    for spec in registry.all_tables():
        counts[spec.module], sent = _reap_module(engine, spec, cfg, app, budget)
        published += sent
        _expire_module(engine, spec, cfg)
    # An idle pass every few seconds is noise; a pass that reaped is worth a line.
    level = logging.INFO if any(counts.values()) else logging.DEBUG
    log.log(level, "reaper: %s (published %d requeued attempts)", counts, published)
    return counts
