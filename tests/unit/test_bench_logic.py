"""The benchmark's pure parts: /proc parsing and how ratios are taken over rounds."""

from __future__ import annotations

import os

import pytest

from bench import bench_validation
from bench.bench_lifecycle import PROCESSES, SYSTEMS, Sample, median_ratio, ratio_lines
from bench.bench_upload import percentiles
from bench.procstat import parse_stat

TICKS = os.sysconf("SC_CLK_TCK")


def test_cpu_counts_own_and_reaped_children_time_even_with_odd_command_names() -> None:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime ...
    line = f"42 (post gres: (x) ) S 7 42 42 0 -1 4194560 10 0 0 0 {TICKS} {TICKS} {2 * TICKS} 0 20"
    assert parse_stat(line) == (7, 4.0)


def _sample(e2e: float) -> Sample:
    return Sample(enqueue=e2e, drain=e2e, e2e=e2e, cpu_ms=dict.fromkeys(PROCESSES, 1.0),
                  wal_syncs=0.0)  # fmt: skip


def test_ratios_are_the_median_of_each_rounds_ratio_not_a_ratio_of_medians() -> None:
    # Rounds share the machine's state: in round 3 something slowed bare Celery alone.
    # Per-round ratios 0.5, 0.5, 1.125 give 0.5; a ratio of medians would say 50/80 = 0.625.
    lifecycle = [_sample(50), _sample(30), _sample(90)]
    bare = [_sample(100), _sample(60), _sample(80)]
    assert median_ratio(lifecycle, bare, "e2e") == pytest.approx(0.5)


def test_every_system_gets_a_ratio_line_per_cluster_and_field() -> None:
    results = {(fsync, system): [_sample(100)] for fsync in ("on", "off") for system in SYSTEMS}
    lines = ratio_lines(results)
    assert "lifecycle/bare e2e ratio (fsync on): 1.00" in lines
    assert "procrastinate/bare drain ratio (fsync off): 1.00" in lines
    assert "lifecycle fsync on/off e2e ratio: 1.00" in lines
    assert not any(line.startswith("bare/bare") for line in lines)


def test_percentiles_of_latencies() -> None:
    p50, p95, p99 = percentiles([float(v) for v in range(1, 101)])
    assert (p50, p95, p99) == pytest.approx((50.5, 95.05, 99.01))
    assert percentiles([0.3]) == (0.3, 0.3, 0.3)


def test_a_smoke_run_on_the_fsync_on_cluster_alone_reports_its_lines_only() -> None:
    results = {("on", system): [_sample(100)] for system in SYSTEMS}
    lines = ratio_lines(results)
    assert "lifecycle/bare e2e ratio (fsync on): 1.00" in lines
    assert not [line for line in lines if "off" in line]


def test_the_validation_bench_times_every_body_with_checks_that_agree() -> None:
    lines = bench_validation.table(n=3)
    assert len(lines) == 2 + 6 + 1  # header, separator, six bodies, validate_body
    assert lines[-1].startswith("validate_body of the typical valid body: ")
