"""The Redis fast path in front of the journal's idempotency window.

The key is written only after the journal committed an enqueue (a new job or a rerun),
and lives no longer than the dedup window counted from that enqueue, while the journal's
window runs from the job's finish: a key present therefore always agrees with what the
journal would answer. A ``duplicate`` answer writes nothing: the journal said so after
the key expired, and a key stored then would outlive the journal's window by up to one
more window. With no ``JOBSAPP_REDIS_URL``, or Redis down, the journal alone decides.
"""

from __future__ import annotations

import logging
from functools import cache

import redis

from jobsapp.lifecycle.journal import EnqueueOutcome, NewJob
from jobsapp.settings import get_settings

log = logging.getLogger(__name__)


@cache
def _client() -> redis.Redis | None:
    url = get_settings().redis_url
    if url is None:
        return None
    return redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)


def _key(job: NewJob) -> str:
    return f"jobsapp:dedup:{job.spec.module}:{job.job_id}"


def seen_recently(job: NewJob) -> bool:
    if job.dedup_window.total_seconds() <= 0:  # most tasks: no window, nothing to look up
        return False
    client = _client()
    if client is None:
        return False
    try:
        return bool(client.exists(_key(job)))
    except redis.RedisError as exc:
        log.warning("dedup fast path unavailable: %s", type(exc).__name__)
        return False


def remember(job: NewJob, outcome: EnqueueOutcome) -> None:
    """Open the fast path's window for a job the journal just enqueued."""
    seconds = int(job.dedup_window.total_seconds())
    client = _client() if seconds > 0 and outcome is EnqueueOutcome.ENQUEUED else None
    if client is None:
        return
    try:
        client.set(_key(job), "1", nx=True, ex=seconds)
    except redis.RedisError as exc:
        log.warning("dedup fast path unavailable: %s", type(exc).__name__)
