"""Prometheus metrics: the journal's, once for the cluster, and each web process's own.

Two registries, because they add up differently. The journal's numbers (``jobsapp_*``,
served on ``/metrics/cluster``) are read from the database at scrape time: the journal is
the one place that knows every run, whichever worker, beat or producer moved it, so every
web replica answers with the same numbers, and a restarted process loses nothing. Scraped
from each replica they would be counted once per replica by a ``sum()``: they are scraped
through one target (the load-balanced address) instead, see docs/operators.md. A
process's own numbers (``process_*``, ``python_*``, ``jobsapp_web_info``, on ``/metrics``)
are scraped from every replica and do add up.

Gauges come from indexed queries; counters, histograms and the finished runs of
``jobsapp_jobs`` are totals that beat keeps (``monitor.rollup``, ``maintenance_counters``,
``run_counts``), so a scrape never aggregates a journal table.
Labels ``task`` and ``queue`` are bounded by ``monitor.labels``; every registered task has
its series from the start, at zero, so ``rate()`` and ``increase()`` see the first job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta

from celery import Celery
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from jobsapp import __version__, flow_control
from jobsapp.lifecycle.flow.gating import Kind
from jobsapp.lifecycle.journal import outbox_queries
from jobsapp.lifecycle.journal.totals import DEDUP_HITS, Key
from jobsapp.lifecycle.rules.states import ACTIVE_STATES, ALL_STATES
from jobsapp.maintenance import relay
from jobsapp.monitor import labels, rollup
from jobsapp.monitor.labels import Labels
from jobsapp.monitor.summary import ACTIVE_CAP, Health, health

EngineFactory = Callable[[], Engine]
StaleAfter = Callable[[], timedelta | float]
AppFactory = Callable[[], Celery]


class JournalCollector(Collector):
    """``jobsapp_*`` gauges, counters and histograms over every run table and the outbox."""

    def __init__(self, engine: EngineFactory, stale_after: StaleAfter, app: AppFactory) -> None:
        # Factories, not values: the configured database is resolved per scrape.
        self._engine = engine
        self._stale_after = stale_after
        self._app = app

    def collect(self) -> Iterator[Metric]:
        engine, names = self._engine(), labels.of_app(self._app())
        numbers = health(engine, self._stale_after())
        yield _jobs(numbers, names)
        yield _oldest_queued(numbers, names)
        yield _stale(numbers)
        yield _capped(numbers)
        yield GaugeMetricFamily(
            "jobsapp_outbox_backlog",
            "Outbox rows that are due and not yet published.",
            value=numbers.outbox_backlog,
        )
        yield GaugeMetricFamily(
            "jobsapp_outbox_lag_seconds",
            "Seconds the oldest due, unpublished outbox row has waited (0 when none).",
            value=numbers.outbox_lag,
        )
        yield from _outbox_upkeep(engine)
        yield from _rolled_up(engine, names)
        yield from _paused(engine, names, numbers)


def _paused(engine: Engine, names: Labels, numbers: Health) -> Iterator[Metric]:
    """1 for each paused queue and domain; 0 for the app's other queues and domains."""
    paused = {(p.kind, p.name) for p in flow_control.paused(engine)}
    for kind, label, known, what in (
        (Kind.QUEUE, "queue", names.queues, "broker queue"),
        (Kind.DOMAIN, "module", numbers.counts.keys(), "domain (run table)"),
    ):
        doc = f"1 while the {what} is paused: nothing is published or claimed for it."
        family = GaugeMetricFamily(f"jobsapp_{kind.value}_paused", doc, labels=[label])
        for name in sorted(set(known) | {n for k, n in paused if k == kind.value}):
            family.add_metric([name], int((kind.value, name) in paused))
        yield family


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
    for result, name in (
        ("published", relay.PUBLISHED),
        ("failed", relay.FAILED),
        ("dead", relay.DEAD),
        ("unclaimed", relay.UNCLAIMED),
        ("unknown_task", relay.UNKNOWN_TASK),
    ):
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
    DEDUP_HITS: ("jobsapp_dedup_hits", "Enqueues absorbed as duplicates of a job_id.", ""),
}
_HISTOGRAMS = {
    rollup.QUEUE_WAIT: (
        "jobsapp_queue_wait_seconds",
        "From when an attempt's message was due to its claim.",
    ),
    rollup.RUN_DURATION: (
        "jobsapp_run_duration_seconds",
        "From an attempt's claim to its end (reaped and cancelled attempts excluded).",
    ),
}


# The label values every registered task's counter starts with, at zero.
_STARTING = {
    rollup.ATTEMPTS: sorted(set(rollup.ENDINGS.values())),
    rollup.REAPED: sorted(set(rollup.REAPS.values())),
    DEDUP_HITS: [""],
}


def _rolled_up(engine: Engine, names: Labels) -> Iterator[Metric]:
    """Counters and histograms by module and task, as of beat's last rollup."""
    with engine.connect() as conn:
        totals = _folded(rollup.read(conn), names)
    for metric, (name, doc, label) in _COUNTERS.items():
        extra = [label] if label else []
        family = CounterMetricFamily(name, doc, labels=["module", "task", *extra])
        for (m, module, task, value_label), value in sorted(totals.items()):
            if m == metric:
                family.add_metric([module, task, *([value_label] if extra else [])], value)
        yield family
    for metric, (name, doc) in _HISTOGRAMS.items():
        cells = {k[1:]: v for k, v in totals.items() if k[0] == metric}
        yield _histogram(name, doc, cells, names)


def _folded(totals: Mapping[Key, int], names: Labels) -> dict[Key, int]:
    """Totals with unregistered task names folded into ``other``, and every registered
    task's counter series present from the start."""
    out = {
        (metric, module, task, value): 0
        for module, task, _ in names.registered()
        for metric, values in _STARTING.items()
        for value in values
    }
    for (metric, module, task, value), n in totals.items():
        key = (metric, module, names.task(task), value)
        out[key] = out.get(key, 0) + n
    return out


def _histogram(
    name: str, doc: str, cells: dict[tuple[str, str, str], int], names: Labels
) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=["module", "task"])
    series = {(m, t) for m, t, _ in cells} | {(m, t) for m, t, _ in names.registered()}
    for module, task in sorted(series):
        running, buckets = 0, []
        for le in [*(rollup.bucket_label(b) for b in rollup.BUCKETS), rollup.INF]:
            running += cells.get((module, task, le), 0)
            buckets.append((le, float(running)))
        seconds = cells.get((module, task, rollup.SUM_MS), 0) / 1000
        family.add_metric([module, task], buckets, sum_value=seconds)
    return family


def _jobs(numbers: Health, names: Labels) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "jobsapp_jobs",
        "Run rows by module, task, queue and state: active ones at scrape time (the oldest "
        f"{ACTIVE_CAP} of a module's state at most: jobsapp_jobs_capped), finished ones as of "
        "beat's last rollup, until retention.",
        labels=["module", "task", "queue", "state"],
    )
    rows = {(*series, state): 0 for series in names.registered() for state in ALL_STATES}
    for ((module, task, queue), state), count in numbers.series_counts.items():
        key = (module, names.task(task), names.queue(task, queue), state)
        rows[key] = rows.get(key, 0) + count
    for key, count in sorted(rows.items()):
        family.add_metric(list(key), count)
    return family


def _oldest_queued(numbers: Health, names: Labels) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "jobsapp_oldest_queued_seconds",
        "Seconds the oldest due queued job has waited for a worker (0 when none), by module, "
        "task and queue.",
        labels=["module", "task", "queue"],
    )
    ages = dict.fromkeys(names.registered(), 0.0)
    for (module, task, queue), age in numbers.series_oldest.items():
        key = (module, names.task(task), names.queue(task, queue))
        ages[key] = max(age, ages.get(key, 0.0))
    for key, age in sorted(ages.items()):
        family.add_metric(list(key), age)
    return family


def _capped(numbers: Health) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "jobsapp_jobs_capped",
        f"1: the module has more than {ACTIVE_CAP} runs in the active state; jobsapp_jobs "
        "counts the oldest of them.",
        labels=["module", "state"],
    )
    for module in numbers.counts:
        for state in ACTIVE_STATES:
            family.add_metric([module, state], int((module, state) in numbers.capped))
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


def celery_app() -> Celery:
    """The app whose registered tasks and queues bound the labels, built on first use."""
    from jobsapp.celery_app import app

    return app


def journal_registry(
    engine: EngineFactory, stale_after: StaleAfter, app: AppFactory
) -> CollectorRegistry:
    """The cluster's numbers; a registry of its own (the process-global one would
    double-register per app)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(JournalCollector(engine, stale_after, app))
    return reg


def process_registry() -> CollectorRegistry:
    """This process's own numbers: CPU, memory, file descriptors, GC, and its version."""
    reg = CollectorRegistry(auto_describe=False)
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR, _Info()):
        reg.register(collector)
    return reg


class _Info(Collector):
    def collect(self) -> Iterator[Metric]:
        # Summed over the replicas it counts them; by version it shows a rollout's progress.
        info = GaugeMetricFamily(
            "jobsapp_web_info", "A web process, by jobsapp version.", labels=["version"]
        )
        info.add_metric([__version__], 1)
        yield info


def exposition(reg: CollectorRegistry) -> bytes:
    """The Prometheus text format of ``reg``; raises when the database cannot be read."""
    return generate_latest(reg)
