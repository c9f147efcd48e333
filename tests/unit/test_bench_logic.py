"""The benchmark's pure parts: /proc parsing and how ratios are taken over rounds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import __main__ as bench_main
from bench import bench_lifecycle, bench_validation
from bench.bench_lifecycle import (
    OFF,
    ON,
    PROCESSES,
    SYSTEMS,
    Events,
    Sample,
    comparisons,
    median_ratio,
    ratio_lines,
    shipped_events,
    systems,
)
from bench.bench_upload import percentiles
from bench.procstat import parse_stat

TICKS = os.sysconf("SC_CLK_TCK")


def test_cpu_counts_own_and_reaped_children_time_even_with_odd_command_names() -> None:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime ...
    line = f"42 (post gres: (x) ) S 7 42 42 0 -1 4194560 10 0 0 0 {TICKS} {TICKS} {2 * TICKS} 0 20"
    assert parse_stat(line) == (7, 4.0)


def _sample(e2e: float, rows: float = 0.0) -> Sample:
    return Sample(
        enqueue=e2e,
        drain=e2e,
        e2e=e2e,
        cpu_ms=dict.fromkeys(PROCESSES, 1.0),
        wal_syncs=0.0,
        rows={"job_runs": 1.0, "job_events": rows - 1.0},
    )


def test_ratios_are_the_median_of_each_rounds_ratio_not_a_ratio_of_medians() -> None:
    # Rounds share the machine's state: in round 3 something slowed bare Celery alone.
    # Per-round ratios 0.5, 0.5, 1.125 give 0.5; a ratio of medians would say 50/80 = 0.625.
    lifecycle = [_sample(50), _sample(30), _sample(90)]
    bare = [_sample(100), _sample(60), _sample(80)]
    assert median_ratio(lifecycle, bare, "e2e") == pytest.approx(0.5)


def test_the_closing_lines_compare_jobsapp_with_each_peer_and_count_its_rows() -> None:
    results = {
        (fsync, system): [_sample(100, rows=5)] for fsync in ("on", "off") for system in SYSTEMS
    }
    results[("on", "naive")] = [_sample(200)]
    results[("on", "procrastinate")] = [_sample(50)]
    lines = ratio_lines(results)
    assert "lifecycle/bare e2e ratio (fsync on): 1.00" in lines
    assert "lifecycle/bare e2e ratio (fsync off, events off): 1.00" in lines
    assert "lifecycle/bare e2e ratio (fsync on, events on): 1.00" in lines
    assert "lifecycle/naive e2e ratio (fsync on): 0.50" in lines
    assert "lifecycle/procrastinate e2e ratio (fsync on): 2.00" in lines
    assert "lifecycle fsync on/off e2e ratio: 1.00" in lines
    assert lines[-1] == "lifecycle journal rows per job: 5.00"


def test_the_as_shipped_line_compares_jobsapp_and_bare_with_the_events_jobsapp_ships(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Events on as shipped: bare+events is the baseline of lifecycle+events, not bare.
    results = {("on", system): [_sample(100)] for system in SYSTEMS}
    results[("on", "bare")] = [_sample(400)]
    monkeypatch.setattr(bench_lifecycle, "COMPARISONS", comparisons(ON))
    assert "lifecycle/bare e2e ratio (fsync on): 1.00" in ratio_lines(results)
    monkeypatch.setattr(bench_lifecycle, "COMPARISONS", comparisons(OFF))
    assert "lifecycle/bare e2e ratio (fsync on): 0.25" in ratio_lines(results)


def test_events_are_read_from_jobsapps_celeryconfig_and_a_mixed_setting_gets_its_own_runs(
    tmp_path: Path,
) -> None:
    config = tmp_path / "celeryconfig.py"
    config.write_text("worker_send_task_events = False\ntask_send_sent_event = True\n")
    shipped = shipped_events(config)
    assert shipped == Events(worker=False, sent=True)
    found = systems(shipped)
    assert {
        "bare",
        "bare+events",
        "bare+shipped",
        "lifecycle",
        "lifecycle+events",
        "lifecycle+shipped",
    } <= set(found)
    assert found["lifecycle-batch"].events == shipped
    first = comparisons(shipped)[0]
    assert (first.jobsapp, first.peer) == ("lifecycle+shipped", "bare+shipped")
    config.write_text("task_acks_late = True\n")  # silent: Celery's defaults, both off
    assert shipped_events(config) == OFF
    assert set(systems(OFF)) == {
        "bare",
        "bare+events",
        "naive",
        "lifecycle",
        "lifecycle+events",
        "lifecycle-batch",
        "lifecycle-nowait",
        "procrastinate",
    }
    assert found["lifecycle-nowait"].env == {"JOBSAPP_FINISH_FLUSH": "no-wait"}


def test_percentiles_of_latencies() -> None:
    p50, p95, p99 = percentiles([float(v) for v in range(1, 101)])
    assert (p50, p95, p99) == pytest.approx((50.5, 95.05, 99.01))
    assert percentiles([0.3]) == (0.3, 0.3, 0.3)


def test_a_smoke_run_on_the_fsync_on_cluster_alone_reports_its_lines_only() -> None:
    results = {("on", system): [_sample(100)] for system in SYSTEMS}
    lines = ratio_lines(results)
    assert "lifecycle/bare e2e ratio (fsync on): 1.00" in lines
    assert not [line for line in lines if "fsync off" in line or "on/off" in line]


def test_the_validation_bench_times_every_body_with_checks_that_agree() -> None:
    lines = bench_validation.table(n=3)
    assert len(lines) == 2 + 6 + 1  # header, separator, six bodies, validate_body
    assert lines[-1].startswith("validate_body of the typical valid body: ")


def test_a_relative_state_dir_is_taken_from_where_the_bench_was_started() -> None:
    # services.sh runs Postgres from another directory: a relative data dir would miss.
    args = bench_main.parse(["lifecycle", "--state-dir", "var/here", "--out", "var/out"])
    assert args.state_dir == Path.cwd() / "var" / "here"
    assert args.out == Path.cwd() / "var" / "out"
