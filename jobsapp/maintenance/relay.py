"""The outbox relay: publishes what the fast path did not, and what was lost.

Three bounded steps per tick: due unpublished rows (a crash after COMMIT, a retry whose
time came); published rows whose job still waits for that attempt's claim after the
check time (a message the broker lost), republished with a doubling check interval; and
rows whose job moved on, marked delivered so they are never looked at again. Each step
repeats while it finds full batches, up to ``max_batches``, so a backlog (beat was down)
is cleared in one tick instead of one batch per tick.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

from celery import Celery
from sqlalchemy import Engine, select, tuple_

from jobsapp.db import utcnow
from jobsapp.lifecycle import journal, outbox, registry
from jobsapp.lifecycle.journal import OUTBOX, PendingMessage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RelayConfig:
    # A fresh row belongs to its producer's fast path for this long.
    grace: timedelta = timedelta(seconds=2)
    unclaimed_after: timedelta = outbox.UNCLAIMED_AFTER
    batch: int = 500
    max_batches: int = 20

    def __post_init__(self) -> None:
        if self.batch < 1 or self.max_batches < 1 or self.unclaimed_after <= timedelta(0):
            raise ValueError("relay needs a positive batch, batch count and unclaimed timeout")


# One bounded step: (rows found, rows done).
Step = Callable[[], tuple[int, int]]


def drain(step: Step, cfg: RelayConfig) -> int:
    """Repeat ``step`` while it fills its batch and all of it succeeds."""
    total = 0
    for _ in range(cfg.max_batches):
        found, done = step()
        total += done
        # A short batch means the backlog is cleared; a partial one means the broker
        # refused some: the rest waits for the next tick rather than spinning here.
        if found < cfg.batch or done < found:
            break
    return total


def _publish_due(app: Celery, engine: Engine, cfg: RelayConfig) -> tuple[int, int]:
    with engine.begin() as conn:
        due = journal.due_messages(conn, now=utcnow() - cfg.grace, limit=cfg.batch)
        accepted = outbox.publish(app, due, unclaimed_after=cfg.unclaimed_after)
        outbox.mark(conn, accepted)
    return len(due), len(accepted)


def _republish_lost(
    app: Celery, engine: Engine, spec: registry.RunTable, cfg: RelayConfig
) -> tuple[int, int]:
    with engine.begin() as conn:
        lost = journal.unclaimed_messages(conn, spec, now=utcnow(), limit=cfg.batch)
        accepted = outbox.publish(app, lost, unclaimed_after=cfg.unclaimed_after)
        outbox.mark(conn, accepted)
    return len(lost), len(accepted)


def _settle(engine: Engine, spec: registry.RunTable, cfg: RelayConfig) -> tuple[int, int]:
    with engine.begin() as conn:
        settled = journal.settle_delivered(conn, spec, now=utcnow(), limit=cfg.batch)
    return settled, settled


def publish_rows(
    app: Celery,
    engine: Engine,
    spec: registry.RunTable,
    keys: Sequence[tuple[uuid.UUID, int]],
    *,
    unclaimed_after: timedelta,
) -> int:
    """Publish the named unpublished rows now: the fast path of a committed reap.

    The reaper's rows have no producer to publish them, so waiting out the relay's grace
    would only delay the rescue. The rows are locked (SKIP LOCKED) and re-checked as
    unpublished, so a relay running at the same time never publishes them a second time.
    """
    if not keys:
        return 0
    stmt = (
        select(OUTBOX)
        .where(
            OUTBOX.c.module == spec.module,
            OUTBOX.c.published_at.is_(None),
            tuple_(OUTBOX.c.job_id, OUTBOX.c.attempt).in_(list(keys)),
        )
        .with_for_update(skip_locked=True)
    )
    with engine.begin() as conn:
        pending = [
            PendingMessage(r["id"], r["job_id"], r["attempt"], r["task_name"], r["body"],
                           r["available_at"], r["publish_count"])
            for r in conn.execute(stmt).mappings()
        ]  # fmt: skip
        accepted = outbox.publish(app, pending, unclaimed_after=unclaimed_after)
        outbox.mark(conn, accepted)
    return len(accepted)


def run_once(app: Celery, engine: Engine, cfg: RelayConfig) -> dict[str, int]:
    counts = {"published": drain(partial(_publish_due, app, engine, cfg), cfg),
              "republished": 0, "settled": 0}  # fmt: skip
    for spec in registry.all_tables():
        # Settle first: a row whose job moved on must not be republished.
        counts["settled"] += drain(partial(_settle, engine, spec, cfg), cfg)
        counts["republished"] += drain(partial(_republish_lost, app, engine, spec, cfg), cfg)
    # An idle pass every few seconds is noise; a pass that moved rows is worth a line.
    log.log(logging.INFO if any(counts.values()) else logging.DEBUG, "outbox relay: %s", counts)
    return counts
