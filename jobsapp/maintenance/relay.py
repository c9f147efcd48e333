"""The outbox relay: publishes what the fast path did not, and what was lost.

Three bounded steps per tick: due unpublished rows (a crash after COMMIT, a retry whose
time came); published rows whose job still waits for that attempt's claim after the
check time (a message the broker lost), republished with a doubling check interval; and
rows whose job moved on, marked delivered so they are never looked at again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from celery import Celery
from sqlalchemy import Engine

from jobsapp.db import utcnow
from jobsapp.lifecycle import journal, outbox, registry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RelayConfig:
    # A fresh row belongs to its producer's fast path for this long.
    grace: timedelta = timedelta(seconds=2)
    unclaimed_after: timedelta = outbox.UNCLAIMED_AFTER
    batch: int = 500

    def __post_init__(self) -> None:
        if self.batch < 1 or self.unclaimed_after <= timedelta(0):
            raise ValueError("relay needs a positive batch and unclaimed timeout")


def _publish_due(app: Celery, engine: Engine, cfg: RelayConfig) -> int:
    with engine.begin() as conn:
        due = journal.due_messages(conn, now=utcnow() - cfg.grace, limit=cfg.batch)
        accepted = outbox.publish(app, due, unclaimed_after=cfg.unclaimed_after)
        outbox.mark(conn, accepted)
    return len(accepted)


def _republish_lost(app: Celery, engine: Engine, spec: registry.RunTable, cfg: RelayConfig) -> int:
    with engine.begin() as conn:
        lost = journal.unclaimed_messages(conn, spec, now=utcnow(), limit=cfg.batch)
        accepted = outbox.publish(app, lost, unclaimed_after=cfg.unclaimed_after)
        outbox.mark(conn, accepted)
    return len(accepted)


def _settle(engine: Engine, spec: registry.RunTable, cfg: RelayConfig) -> int:
    with engine.begin() as conn:
        return journal.settle_delivered(conn, spec, now=utcnow(), limit=cfg.batch)


def run_once(app: Celery, engine: Engine, cfg: RelayConfig) -> dict[str, int]:
    counts = {"published": _publish_due(app, engine, cfg), "republished": 0, "settled": 0}
    for spec in registry.all_tables():
        counts["settled"] += _settle(engine, spec, cfg)
        counts["republished"] += _republish_lost(app, engine, spec, cfg)
    log.info("outbox relay: %s", counts)
    return counts
