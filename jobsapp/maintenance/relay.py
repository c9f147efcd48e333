"""The outbox relay: publishes what the fast path did not, and what was lost.

Bounded steps per tick: due unpublished rows (a crash after COMMIT, a retry whose time
came); per run table, rows whose job moved on, marked delivered so they are never looked
at again (dead ones too: a late copy ran); published rows whose job still waits for that
attempt's claim after the check time, which are either still waiting in their queue
(the broker's queue depth says so: checked again later, never copied, never dead) or were
lost by the broker (republished with a doubling check interval, dead after
``MAX_UNCLAIMED_PUBLISHES``); and a sweep for queued runs with no outbox row at all,
repaired. Each step repeats while it
finds full batches, up to ``max_batches`` and within the pass's budget, so a backlog
(beat was down) is cleared in a few ticks without holding beat.

A broker error ends the step at once: the broker is down for every row, and each try
would cost the publish timeout. A row whose message fails on its own (a body that no
longer validates) is backed off and, after a bound, dead; it never blocks newer rows.
Due and check times are read on the database's clock, not beat's.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from celery import Celery
from sqlalchemy import Connection, Engine

from jobsapp.lifecycle import journal
from jobsapp.lifecycle.flow import priorities
from jobsapp.lifecycle.journal import PendingMessage, registry
from jobsapp.lifecycle.journal import outbox_queries as queries
from jobsapp.lifecycle.journal.kept_headers import with_kept_headers
from jobsapp.lifecycle.transport import outbox, publisher
from jobsapp.maintenance import lease
from jobsapp.maintenance.budget import DEFAULT_BUDGET, Budget, for_pass

log = logging.getLogger(__name__)

COUNTS = ("published", "republished", "settled", "dead", "repaired")
# The relay's running totals in ``maintenance_counters``, for /metrics.
PUBLISHED, FAILED, DEAD = "relay_published", "relay_failed", "relay_dead"
# Republished because no worker claimed them in time; and of those, messages for a task
# this process has not registered either (a missing JOBSAPP_IMPORTS, a misspelt name).
UNCLAIMED, UNKNOWN_TASK = "relay_unclaimed", "relay_unknown_task"


@dataclass(frozen=True)
class RelayConfig:
    # A fresh row belongs to its producer's fast path for this long after it is due (on
    # PostgreSQL, after its COMMIT for a transaction over 0.5 s: migration 0010).
    grace: timedelta = timedelta(seconds=2)
    unclaimed_after: timedelta = outbox.UNCLAIMED_AFTER
    batch: int = 500
    max_batches: int = 20
    budget: timedelta = DEFAULT_BUDGET

    def __post_init__(self) -> None:
        if self.batch < 1 or self.max_batches < 1 or self.unclaimed_after <= timedelta(0):
            raise ValueError("relay needs a positive batch, batch count and unclaimed timeout")


@dataclass(frozen=True)
class Done:
    """One bounded step: rows found, rows it counts, rows killed, and whether the broker failed."""

    found: int
    done: int
    dead: int = 0
    broker_down: bool = False


Step = Callable[[], Done]


def drain(step: Step, cfg: RelayConfig, budget: Budget) -> tuple[int, int, bool]:
    """Repeat ``step`` while it fills its batch; (done, dead, broker down)."""
    total = dead = 0
    for _ in range(cfg.max_batches):
        result = step()
        total, dead = total + result.done, dead + result.dead
        if result.broker_down:
            return total, dead, True
        if result.found < cfg.batch or not budget.allows_more():
            break
    return total, dead, False


# What a pick found in the caller's transaction: (rows to send, rows found, rows it
# killed without sending).
Picked = tuple[list[PendingMessage], int, int]
Select = Callable[[Connection, datetime], Picked]


def _record(
    conn: Connection, messages: Sequence[PendingMessage], report: outbox.Report, now: datetime
) -> int:
    """Mark what the broker took, set back what refused on its own; returns rows killed.

    Every publish that raised (the row's fault or the broker's) counts as failed."""
    outbox.mark(conn, report.accepted)
    queries.bump(conn, FAILED, len(report.refused) + (report.broker_error is not None))
    return queries.set_back(conn, outbox.setbacks(messages, report.refused, now), now=now)


def _select_and_send(app: Celery, engine: Engine, unclaimed_after: timedelta, pick: Select) -> Done:
    """PostgreSQL: publish while the rows are locked, so a second relay skips them.
    SQLite: every transaction holds the database's write lock, which must never wait on a
    broker (uploads and heartbeats queue behind it): pick, publish outside, record."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            now = lease.database_now(conn)
            rows, found, buried = pick(conn, now)
            rows = with_kept_headers(conn, rows)
            report = outbox.publish(app, rows, unclaimed_after=unclaimed_after)
            dead = _record(conn, rows, report, now)
    else:
        with engine.begin() as conn:
            now = lease.database_now(conn)
            rows, found, buried = pick(conn, now)
            rows = with_kept_headers(conn, rows)
        report = outbox.publish(app, rows, unclaimed_after=unclaimed_after)
        with engine.begin() as conn:
            dead = _record(conn, rows, report, now)
    return Done(found, len(report.accepted), dead + buried, report.broker_error is not None)


def _due(cfg: RelayConfig, app: Celery, conn: Connection, now: datetime) -> Picked:
    due = queries.due_messages(
        conn,
        now=now - cfg.grace,
        limit=cfg.batch,
        default_queue=app.conf.task_default_queue,
        lowest_first=priorities.lowest_first(app),
    )
    return due, len(due), 0


def unknown_tasks(lost: Sequence[PendingMessage], registered: Collection[str]) -> list[str]:
    """Task names of unclaimed messages that this app has not registered either."""
    return sorted({m.task_name for m in lost} - set(registered))


def _report_unclaimed(
    app: Celery,
    conn: Connection,
    lost: Sequence[PendingMessage],
    waiting: Sequence[PendingMessage],
) -> None:
    """Say what nobody claimed: the guard drops a task no worker knows, so the claim check
    is the one signal at relay time (``inspect().registered()`` would ask every worker over
    the broker on every tick, and only on brokers with a control channel)."""
    for name in unknown_tasks([*lost, *waiting], app.tasks.keys()):
        log.error(
            "relay: task %s is registered nowhere in this app; no worker will run it "
            "(is its module in JOBSAPP_IMPORTS?)",
            name,
        )
    if not lost:
        return
    unknown = unknown_tasks(lost, app.tasks.keys())
    for (name, queue), count in Counter((m.task_name, m.queue) for m in lost).items():
        log.warning(
            "relay: %d messages of %s on queue %s were not claimed; republishing: "
            "does a worker consuming that queue import the task?",
            count,
            name,
            queue or "default",
        )
    queries.bump(conn, UNCLAIMED, len(lost))
    queries.bump(conn, UNKNOWN_TASK, sum(m.task_name in unknown for m in lost))


def _lost(
    app: Celery, spec: registry.RunTable, cfg: RelayConfig, conn: Connection, now: datetime
) -> Picked:
    """Unclaimed rows the broker lost, to republish; those republished too often are
    buried instead. Rows whose message may still wait in its queue are checked later."""
    unclaimed = queries.unclaimed_messages(
        conn, spec, now=now, limit=cfg.batch, default_queue=app.conf.task_default_queue
    )
    lost, waiting = _tell_lost(app, unclaimed)
    queries.check_later(conn, waiting, now=now, wait=partial(_wait_again, cfg.unclaimed_after))
    _report_unclaimed(app, conn, lost, waiting)
    hopeless = [m.id for m in lost if outbox.never_claimed(m)]
    buried = queries.bury(
        conn,
        hopeless,
        now=now,
        reason=(
            f"published {outbox.MAX_UNCLAIMED_PUBLISHES} times and never claimed: "
            "does any worker run this task?"
        ),
    )
    return [m for m in lost if m.id not in hopeless], len(unclaimed), buried


def _tell_lost(
    app: Celery, unclaimed: Sequence[PendingMessage]
) -> tuple[list[PendingMessage], list[PendingMessage]]:
    """(lost, waiting), from the depth of each queue as the broker reports it. A broker
    that cannot answer takes them all as lost: the republish then meets the same error
    (the step ends, broker down) or finds the broker back."""
    if not unclaimed:
        return [], []
    queue_of = partial(outbox.queue_name, app)
    try:
        depths = publisher.queue_depths(app, map(queue_of, unclaimed))
    except publisher.BROKER_ERRORS as exc:
        log.warning("relay: queue depths unavailable (%s); republishing", type(exc).__name__)
        return list(unclaimed), []
    lost, waiting = outbox.lost_and_waiting(
        unclaimed, depths, queue_of, lowest_first=priorities.lowest_first(app)
    )
    for queue, count in Counter(map(queue_of, waiting)).items():
        log.info(
            "relay: %d messages on queue %s not claimed yet; the queue holds %d "
            "messages, so they wait there: checked again later",
            count,
            queue,
            depths[queue],
        )
    return lost, waiting


def _wait_again(unclaimed_after: timedelta, publish_count: int) -> timedelta:
    """A message still waiting is checked again after the wait its last publish had."""
    return outbox.check_wait(publish_count - 1, unclaimed_after)


def _publish_due(app: Celery, engine: Engine, cfg: RelayConfig) -> Done:
    return _select_and_send(app, engine, cfg.unclaimed_after, partial(_due, cfg, app))


def _republish_lost(app: Celery, engine: Engine, spec: registry.RunTable, cfg: RelayConfig) -> Done:
    return _select_and_send(app, engine, cfg.unclaimed_after, partial(_lost, app, spec, cfg))


def _settle(engine: Engine, spec: registry.RunTable, cfg: RelayConfig) -> Done:
    with engine.begin() as conn:
        now = lease.database_now(conn)
        settled = queries.settle_delivered(conn, spec, now=now, limit=cfg.batch)
        # A dead row whose job ran after all (a late copy) is no alarm any more.
        revived = queries.settle_dead(conn, spec, now=now, limit=cfg.batch)
    if revived:
        log.info("relay: %d dead %s outbox rows settled: their job moved on", revived, spec.module)
    return Done(max(settled, revived), settled + revived)


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

    def pick(conn: Connection, _now: datetime) -> Picked:
        rows = queries.rows_by_attempt(conn, spec, keys, default_queue=app.conf.task_default_queue)
        return rows, len(rows), 0

    return _select_and_send(app, engine, unclaimed_after, pick).done


# ------------------------------------------------------------- invariant sweep

# Where the next sweep of each run table (per database) starts; beat is one long-lived
# process.
_sweep_cursor: dict[tuple[str, str], queries.Cursor | None] = {}


def repair_missing(engine: Engine, spec: registry.RunTable, cfg: RelayConfig) -> Done:
    """One page of queued runs: each without an outbox row for its next attempt gets one.

    A queued run always has one (pending, inflight or dead), written with the transition
    that queued it; a run without one would wait forever, so the relay writes it, counts
    the repair (``jobsapp_outbox_repaired_total``) and says so.
    """
    with engine.begin() as conn:
        now = lease.database_now(conn)
        key = (str(engine.url), spec.module)
        missing, cursor = queries.missing_messages(
            conn, spec, after=_sweep_cursor.get(key), limit=cfg.batch
        )
        for run in missing:
            attempt = int(run["attempts"]) + 1
            journal.add_outbox(
                conn,
                spec,
                run,
                attempt=attempt,
                now=now,
                available_at=max(now, run["next_retry_at"] or now),
            )
            log.warning(
                "relay: %s job %s was queued with no message for attempt %d; wrote one",
                spec.module,
                run["job_id"],
                attempt,
            )
        queries.bump(conn, queries.REPAIRED, len(missing))
    _sweep_cursor[key] = cursor
    return Done(len(missing), len(missing))


# ------------------------------------------------------------------ the pass


def _add_totals(engine: Engine, counts: dict[str, int]) -> None:
    """One write per pass that published or buried: a busy relay does not pay per row."""
    published = counts["published"] + counts["republished"]
    if not (published or counts["dead"]):
        return
    with engine.begin() as conn:
        queries.bump(conn, PUBLISHED, published)
        queries.bump(conn, DEAD, counts["dead"])


def run_once(
    app: Celery, engine: Engine, cfg: RelayConfig, budget: Budget | None = None
) -> dict[str, int]:
    budget = budget or for_pass(cfg.budget)
    counts = dict.fromkeys(COUNTS, 0)
    published, dead, down = drain(partial(_publish_due, app, engine, cfg), cfg, budget)
    counts["published"], counts["dead"] = published, dead
    for spec in registry.all_tables():
        # Settle first: a row whose job moved on must not be republished.
        counts["settled"] += drain(partial(_settle, engine, spec, cfg), cfg, budget)[0]
        if not down and budget.allows_more():
            republished, dead, down = drain(
                partial(_republish_lost, app, engine, spec, cfg), cfg, budget
            )
            counts["republished"] += republished
            counts["dead"] += dead
        # One page per tick: the sweep is a safety net, not a scan of the whole journal.
        counts["repaired"] += repair_missing(engine, spec, cfg).done
    # An idle pass every few seconds is noise; a pass that moved rows is worth a line.
    _add_totals(engine, counts)
    log.log(logging.INFO if any(counts.values()) else logging.DEBUG, "outbox relay: %s", counts)
    return counts
