"""The reaper: frees runs whose heartbeat went stale (a dead or frozen worker).

Per run table: requeue while attempts and rescues remain, else fail with ``stale``.
The decision is pure; the write is one guarded batch per table. After the batch
commits, the reaper publishes the requeued attempts' messages itself (given an app),
as a producer does after its COMMIT; whatever that misses, the relay publishes.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from jobsapp.db import utcnow
from jobsapp.lifecycle import journal, outbox, registry
from jobsapp.lifecycle.journal import StaleRun
from jobsapp.lifecycle.registry import RunTable, StalePolicy
from jobsapp.maintenance import relay

log = logging.getLogger(__name__)

# How long one reaper batch waits for a row lock before it gives up until the next tick.
LOCK_TIMEOUT_MS = 2000


@dataclass(frozen=True)
class ReaperConfig:
    stale_after: timedelta
    batch: int = 200
    max_batches: int = 20
    # The check interval given to the messages the reaper publishes (see outbox).
    unclaimed_after: timedelta = outbox.UNCLAIMED_AFTER

    def __post_init__(self) -> None:
        if self.stale_after <= timedelta(0) or self.batch < 1 or self.max_batches < 1:
            raise ValueError("reaper needs a positive stale limit, batch and batch count")


def should_requeue(run: StaleRun, spec: RunTable) -> bool:
    """Requeue only under a requeue policy, with attempts and rescues to spare."""
    return (
        spec.stale_policy is StalePolicy.REQUEUE
        and run.attempt < run.max_attempts
        and run.rescues < spec.rescue_limit
    )


def reason_for(run: StaleRun, spec: RunTable, stale_after: timedelta) -> str:
    """The record kept in ``last_error`` and ``job_events``; one per kind of decision."""
    base = f"heartbeat older than {stale_after.total_seconds():g}s: the worker died or froze"
    if should_requeue(run, spec):
        return f"{base}; requeued"
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


def _reap_table(engine: Engine, spec: RunTable, cfg: ReaperConfig, now: datetime) -> _Batch:
    cutoff = now - cfg.stale_after
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # A frozen process holding a domain row (an attachment) must not stall beat:
            # the batch gives up, and the next tick tries again.
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_MS}ms'")
        stale = journal.find_stale(conn, spec, cutoff=cutoff, limit=cfg.batch)
        groups: dict[str, list[StaleRun]] = defaultdict(list)
        for run in stale:
            groups[reason_for(run, spec, cfg.stale_after)].append(run)
        reaped = 0
        requeued: list[tuple[uuid.UUID, int]] = []
        for reason, runs in groups.items():
            requeue_them = should_requeue(runs[0], spec)
            done = journal.reap(conn, spec, runs, requeue_them=requeue_them, cutoff=cutoff,
                                reason=reason, now=now)  # fmt: skip
            reaped += len(done)
            if requeue_them:
                requeued += [(r.job_id, r.attempt + 1) for r in done]
    return _Batch(found=len(stale), reaped=reaped, requeued=requeued)


def run_once(engine: Engine, cfg: ReaperConfig, app: Celery | None = None) -> dict[str, int]:
    """One bounded pass over every run table; returns reaped counts per module.

    With ``app`` the requeued attempts are published right after each batch commits.
    """
    counts: dict[str, int] = {}
    published = 0
    for spec in registry.all_tables():
        total = 0
        for _ in range(cfg.max_batches):
            try:
                batch = _reap_table(engine, spec, cfg, utcnow())
            except OperationalError as blocked:
                log.warning("reaper: %s batch gave up (%s); next tick retries", spec.module,
                            type(blocked.orig).__name__)  # fmt: skip
                break
            total += batch.reaped
            if app is not None:
                published += relay.publish_rows(app, engine, spec, batch.requeued,
                                                unclaimed_after=cfg.unclaimed_after)  # fmt: skip
            # Count what was found, not reaped: a row another reaper took meanwhile
            # still means the backlog may go on.
            if batch.found < cfg.batch:
                break
        counts[spec.module] = total
    # An idle pass every few seconds is noise; a pass that reaped is worth a line.
    level = logging.INFO if any(counts.values()) else logging.DEBUG
    log.log(level, "reaper: %s (published %d requeued attempts)", counts, published)
    return counts
