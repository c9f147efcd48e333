"""The reaper: frees runs whose heartbeat went stale (a dead or frozen worker).

Per run table: requeue while attempts and rescues remain, else fail with ``stale``.
The decision is pure; the write is one guarded batch per table.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine

from jobsapp.db import utcnow
from jobsapp.lifecycle import journal, registry
from jobsapp.lifecycle.journal import StaleRun
from jobsapp.lifecycle.registry import RunTable, StalePolicy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReaperConfig:
    stale_after: timedelta
    batch: int = 200
    max_batches: int = 20

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
    if run.rescues >= spec.rescue_limit:
        return f"{base}; rescued {spec.rescue_limit} times already: a job that kills its worker"
    if run.attempt >= run.max_attempts:
        return f"{base}; no attempts left"
    return f"{base}; this run table fails stale runs"


def _reap_table(engine: Engine, spec: RunTable, cfg: ReaperConfig, now: datetime) -> int:
    cutoff = now - cfg.stale_after
    with engine.begin() as conn:
        stale = journal.find_stale(conn, spec, cutoff=cutoff, limit=cfg.batch)
        groups: dict[str, list[StaleRun]] = defaultdict(list)
        for run in stale:
            groups[reason_for(run, spec, cfg.stale_after)].append(run)
        reaped = [
            journal.reap(conn, spec, runs, requeue_them=should_requeue(runs[0], spec),
                         cutoff=cutoff, reason=reason, now=now)
            for reason, runs in groups.items()
        ]  # fmt: skip
    return sum(map(len, reaped))


def run_once(engine: Engine, cfg: ReaperConfig) -> dict[str, int]:
    """One bounded pass over every run table; returns reaped counts per module."""
    counts: dict[str, int] = {}
    for spec in registry.all_tables():
        total = 0
        for _ in range(cfg.max_batches):
            reaped = _reap_table(engine, spec, cfg, utcnow())
            total += reaped
            if reaped < cfg.batch:
                break
        counts[spec.module] = total
    log.info("reaper: %s", counts)
    return counts
