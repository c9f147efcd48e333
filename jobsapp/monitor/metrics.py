"""Prometheus metrics of the journal, read from the database at scrape time.

A custom collector rather than gauges updated by the processes: the journal is the one
place that knows every run, whichever worker, beat or producer moved it, so a scrape of
any web process reports the same numbers and a restarted process loses nothing.
Gauges come from indexed queries; counters and histograms are totals that beat keeps
(``monitor.rollup``, ``maintenance_counters``), so a scrape never aggregates a table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from jobsapp.lifecycle import outbox_queries
from jobsapp.maintenance import relay
from jobsapp.monitor import rollup
from jobsapp.monitor.summary import Health, health

EngineFactory = Callable[[], Engine]
StaleAfter = Callable[[], timedelta | float]


class JournalCollector(Collector):
    """``jobsapp_*`` gauges over every registered run table and the outbox."""

    def __init__(self, engine: EngineFactory, stale_after: StaleAfter) -> None:
        # Factories, not values: the configured database is resolved per scrape.
        self._engine = engine
        self._stale_after = stale_after

    def collect(self) -> Iterator[Metric]:
        numbers = health(self._engine(), self._stale_after())
        yield _jobs(numbers)
        yield _oldest_queued(numbers)
        yield _stale(numbers)
        yield GaugeMetricFamily(
            "jobsapp_outbox_backlog", "Outbox rows that are due and not yet published.",
            value=numbers.outbox_backlog,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "jobsapp_outbox_lag_seconds",
            "Seconds the oldest due, unpublished outbox row has waited (0 when none).",
            value=numbers.outbox_lag,
        )
        yield from _outbox_upkeep(self._engine())
        yield from _rolled_up(self._engine())


def _outbox_upkeep(engine: Engine) -> Iterator[Metric]:
    """Dead rows (the partial index of dead rows) and the relay's repair total."""
    with engine.connect() as conn:
        dead = outbox_queries.count_dead(conn)
        totals = outbox_queries.counters(conn)
    repaired = totals.get(outbox_queries.REPAIRED, 0)
    relayed = CounterMetricFamily(
        "jobsapp_relay_messages",
        "Outbox messages the relay handed to the broker (published), whose publish raised "
        "(failed), or that it gave up on (dead); republished because no worker claimed them "
        "(unclaimed), of which for a task this app has not registered (unknown_task).",
        labels=["result"],
    )
    for result, name in (("published", relay.PUBLISHED), ("failed", relay.FAILED),
                         ("dead", relay.DEAD), ("unclaimed", relay.UNCLAIMED),
                         ("unknown_task", relay.UNKNOWN_TASK)):  # fmt: skip
        relayed.add_metric([result], totals.get(name, 0))
    yield relayed
    yield GaugeMetricFamily(
        "jobsapp_outbox_dead",
        "Outbox rows the relay gave up on; an operator retries them (see docs/reliability.md).",
        value=dead,
    )
    yield CounterMetricFamily(
        "jobsapp_outbox_repaired",
        "Queued runs the relay found with no outbox row for their next attempt, and repaired.",
        value=repaired,
    )


_COUNTERS = {
    rollup.ATTEMPTS: ("jobsapp_attempts", "Attempts ended, by outcome.", "outcome"),
    rollup.REAPED: ("jobsapp_reaped", "Runs the reaper took back, requeued or failed.", "outcome"),
    rollup.DEDUP_HITS: ("jobsapp_dedup_hits", "Enqueues absorbed as duplicates of a job_id.", ""),
}  # fmt: skip
_HISTOGRAMS = {
    rollup.QUEUE_WAIT: ("jobsapp_queue_wait_seconds",
                        "From when an attempt's message was due to its claim."),
    rollup.RUN_DURATION: ("jobsapp_run_duration_seconds",
                          "From an attempt's claim to its end (reaped runs excluded)."),
}  # fmt: skip


def _rolled_up(engine: Engine) -> Iterator[Metric]:
    """Counters and histograms by module and task, as of beat's last rollup."""
    with engine.connect() as conn:
        totals = rollup.read(conn)
    for metric, (name, doc, label) in _COUNTERS.items():
        extra = [label] if label else []
        family = CounterMetricFamily(name, doc, labels=["module", "task", *extra])
        for (m, module, task, value_label), value in sorted(totals.items()):
            if m == metric:
                family.add_metric([module, task, *([value_label] if extra else [])], value)
        yield family
    for metric, (name, doc) in _HISTOGRAMS.items():
        yield _histogram(name, doc, {k[1:]: v for k, v in totals.items() if k[0] == metric})


def _histogram(name: str, doc: str, cells: dict[tuple[str, str, str], int]) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=["module", "task"])
    for module, task in sorted({(m, t) for m, t, _ in cells}):
        running, buckets = 0, []
        for le in [*(rollup.bucket_label(b) for b in rollup.BUCKETS), rollup.INF]:
            running += cells.get((module, task, le), 0)
            buckets.append((le, float(running)))
        seconds = cells.get((module, task, rollup.SUM_MS), 0) / 1000
        family.add_metric([module, task], buckets, sum_value=seconds)
    return family


def _jobs(numbers: Health) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "jobsapp_jobs", "Run rows by module and state (terminal rows until retention).",
        labels=["module", "state"],
    )  # fmt: skip
    for module, by_state in numbers.counts.items():
        for state, count in by_state.items():
            family.add_metric([module, state], count)
    return family


def _oldest_queued(numbers: Health) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "jobsapp_oldest_queued_seconds",
        "Seconds the oldest due queued job has waited for a worker (0 when none).",
        labels=["module"],
    )
    for module, age in numbers.oldest_queued_age.items():
        family.add_metric([module], age or 0.0)
    return family


def _stale(numbers: Health) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "jobsapp_stale_running",
        "Running jobs whose heartbeat is older than the stale limit (the reaper's work).",
        labels=["module"],
    )
    for module, count in numbers.stale_running.items():
        family.add_metric([module], count)
    return family


def journal_registry(engine: EngineFactory, stale_after: StaleAfter) -> CollectorRegistry:
    """A registry of its own: the process-global one would double-register per app."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(JournalCollector(engine, stale_after))
    return reg


def exposition(reg: CollectorRegistry) -> bytes:
    """The Prometheus text format of ``reg``; raises when the database cannot be read."""
    return generate_latest(reg)
