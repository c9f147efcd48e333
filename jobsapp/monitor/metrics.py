"""Prometheus metrics of the journal, read from the database at scrape time.

A custom collector rather than gauges updated by the processes: the journal is the one
place that knows every run, whichever worker, beat or producer moved it, so a scrape of
any web process reports the same numbers and a restarted process loses nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from jobsapp.lifecycle import outbox_queries
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


def _outbox_upkeep(engine: Engine) -> Iterator[Metric]:
    """Dead rows (the partial index of dead rows) and the relay's repair total."""
    with engine.connect() as conn:
        dead = outbox_queries.count_dead(conn)
        repaired = outbox_queries.counters(conn).get(outbox_queries.REPAIRED, 0)
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
