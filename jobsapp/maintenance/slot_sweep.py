"""The key slots' safety net, run with every relay tick: slots whose run ended another
way than its finish or its reap (a cancel, an expiry, a revoke, a crash between two
statements) are freed, and free slots go to their key's oldest waiters, published at once.

Bounded (a page of each per run table) and safe to run twice at once: each release is
guarded on the run having ended, each grant serialised per key (journal/key_slots.py).
"""

from __future__ import annotations

import logging

from celery import Celery
from sqlalchemy import Engine

from jobsapp.lifecycle.journal import key_slots, registry
from jobsapp.lifecycle.worker import key_limits

log = logging.getLogger(__name__)

BATCH = 500


def run_once(app: Celery, engine: Engine, batch: int = BATCH) -> dict[str, int]:
    counts = {"slots_freed": 0, "slots_granted": 0}
    for spec in registry.all_tables():
        with engine.begin() as conn:
            ended = key_slots.ended_holders(conn, spec, limit=batch)
            granted = key_slots.Granted()
            for job_id in ended:
                granted += key_slots.release(conn, spec, job_id, if_ended=True)
            for key, limit in key_slots.keys_with_room(conn, spec, limit=batch):
                granted += key_slots.grant(conn, spec, key, limit)
        key_limits.publish_granted(app, granted)
        counts["slots_freed"] += len(ended)
        counts["slots_granted"] += len(granted.job_ids)
    if any(counts.values()):
        log.info("key slots: %s", counts)
    return counts
