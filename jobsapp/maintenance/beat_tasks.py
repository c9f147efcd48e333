"""The maintenance passes as Celery tasks; beat's LeasedScheduler runs them in-process.

They may also be sent to a worker or run by ``jobsapp maintenance run-once``: every pass
is safe to run twice at once. ``JOBSAPP_REAPER_BATCH`` and ``JOBSAPP_RELAY_BATCH`` size
their batches (rows per transaction); the defaults suit a production backlog. Staging
retention reads ``JOBSAPP_STAGING_ORPHAN_HOURS``, ``JOBSAPP_STAGING_FAILED_DAYS`` (its
windows, see docs/retention.md) and ``JOBSAPP_STAGING_SCAN_LIMIT`` (objects per tick).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from jobsapp.attachments.store import get_store
from jobsapp.celery_app import app
from jobsapp.db import get_engine
from jobsapp.maintenance import reaper, reconcile, relay, retention, slot_sweep, staging
from jobsapp.monitor import rollup
from jobsapp.settings import get_settings, positive_number, whole_number


def reaper_config() -> reaper.ReaperConfig:
    settings = get_settings()
    return reaper.ReaperConfig(
        stale_after=timedelta(seconds=settings.stale_after),
        batch=whole_number(os.environ, "JOBSAPP_REAPER_BATCH", reaper.ReaperConfig.batch),
        unclaimed_after=timedelta(seconds=settings.unclaimed_after),
    )


def relay_config() -> relay.RelayConfig:
    return relay.RelayConfig(
        unclaimed_after=timedelta(seconds=get_settings().unclaimed_after),
        batch=whole_number(os.environ, "JOBSAPP_RELAY_BATCH", relay.RelayConfig.batch),
    )


def staging_config() -> staging.StagingConfig:
    env = os.environ
    default = staging.StagingConfig
    hours = default.orphan_after.total_seconds() / 3600
    days = default.failed_after.total_seconds() / 86400
    return staging.StagingConfig(
        orphan_after=timedelta(hours=positive_number(env, "JOBSAPP_STAGING_ORPHAN_HOURS", hours)),
        failed_after=timedelta(days=positive_number(env, "JOBSAPP_STAGING_FAILED_DAYS", days)),
        scan_limit=whole_number(env, "JOBSAPP_STAGING_SCAN_LIMIT", default.scan_limit),
    )


@app.task(name="jobsapp.maintenance.reaper", ignore_result=True)
def reap() -> dict[str, int]:
    return reaper.run_once(get_engine(), reaper_config(), app)


@app.task(name="jobsapp.maintenance.relay", ignore_result=True)
def relay_outbox() -> dict[str, int]:
    # The key slots' net first: a slot it frees is published in this same tick.
    freed = slot_sweep.run_once(app, get_engine())
    return freed | relay.run_once(app, get_engine(), relay_config())


@app.task(name="jobsapp.maintenance.retention", ignore_result=True)
def prune() -> dict[str, int]:
    return retention.run_once(get_engine(), retention.RetentionConfig())


# Where the next staging pass starts listing; beat runs the passes in one long-lived
# process, so a backlog bigger than one tick is worked through shard by shard.
_staging_next_shard = 0


@app.task(name="jobsapp.maintenance.staging", ignore_result=True)
def sweep_staging() -> dict[str, int]:
    global _staging_next_shard  # noqa: PLW0603 - the pass's only state, see above
    report = staging.run_once(
        get_engine(), get_store(), staging_config(), start_shard=_staging_next_shard
    )
    _staging_next_shard = report.next_shard
    return report.counts


@app.task(name="jobsapp.maintenance.reconcile", ignore_result=True)
def reconcile_failed() -> dict[str, int]:
    reports = reconcile.run_all(get_engine(), app, reconcile.Request())
    return {f"{r.module}.{name}": n for r in reports for name, n in r.counts().items()}


@app.task(name="jobsapp.maintenance.metrics", ignore_result=True)
def roll_up_metrics() -> dict[str, int]:
    return {"events": rollup.run_once(get_engine())}


PASSES: dict[str, Any] = {
    "reaper": reap,
    "relay": relay_outbox,
    "retention": prune,
    "staging": sweep_staging,
    "reconcile": reconcile_failed,
    "metrics": roll_up_metrics,
}
