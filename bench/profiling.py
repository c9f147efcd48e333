"""One profiled side of the lifecycle: ``python bench/profiling.py producer|worker N OUT``.

Run as a file, with PYTHONPATH naming the tree under test (this checkout, or an older
commit's ``git worktree``), so it imports only what every commit has: jobsapp's Celery
app and ``bench.lifecycle_tasks``. ``producer`` sends WARM then 2N ``.delay()`` of the
no-op lifecycle job; ``worker`` runs a solo-pool worker that drains all of them. After
the warm-up, N jobs are timed without a profiler (the CPU and wall ms per job) and N
more run under cProfile timing CPU, not wall (whose overhead would inflate the figure).
Writes the profile text to OUT and prints one JSON line: CPU and wall ms per job, and
each package's share of the profiled self time.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import json
import os
import pstats
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WARM = 20
TOP = 60
# Whose code the time is spent in, by the path of the function (or a C method's name).
PACKAGES = ("jobsapp", "celery", "kombu", "redis", "sqlalchemy", "psycopg2", "jsonschema")
_SITE = re.compile(r"[/\\]site-packages[/\\]([A-Za-z0-9_]+)")


def package_of(filename: str, function: str) -> str:
    """The package a profiled function belongs to: one of PACKAGES, else ``other``."""
    if filename == "~":  # a C function: its name says whose, e.g. psycopg2's cursor
        return next((p for p in PACKAGES if p in function), "other")
    site = _SITE.search(filename)
    if site is not None:
        return site.group(1) if site.group(1) in PACKAGES else "other"
    return "jobsapp" if re.search(r"[/\\]jobsapp[/\\]", filename) else "other"


def shares(stats: pstats.Stats) -> dict[str, float]:
    """Each package's share of the self time (tottime), which adds up to the total."""
    by_package = dict.fromkeys((*PACKAGES, "other"), 0.0)
    raw: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    for (filename, _line, function), (_cc, _nc, tottime, *_rest) in raw.items():
        by_package[package_of(filename, function)] += tottime
    total = sum(by_package.values()) or 1.0
    return {name: round(seconds / total, 3) for name, seconds in by_package.items()}


def report(profile: cProfile.Profile, n: int, wall: float, cpu: float, out: str) -> None:
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    share = shares(stats)
    parts = ", ".join(f"{k} {v:.1%}" for k, v in share.items())
    text.write(
        f"{n} jobs without the profiler: CPU {cpu * 1000 / n:.3f} ms/job, wall "
        f"{wall * 1000 / n:.3f} ms/job; {n} more under cProfile (CPU seconds below)\n"
        f"share of self CPU time: {parts}\n\n"
    )
    stats.sort_stats("cumulative").print_stats(TOP)
    Path(out).write_text(text.getvalue())
    print(json.dumps({"cpu_ms": cpu * 1000 / n, "wall_ms": wall * 1000 / n, "shares": share}))


def producer(n: int, out: str) -> None:
    from bench.lifecycle_tasks import with_lifecycle

    for _ in range(WARM):
        with_lifecycle.delay()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        with_lifecycle.delay()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    for _ in range(n):
        with_lifecycle.delay()
    profile.disable()
    report(profile, n, wall, cpu, out)


def worker(n: int, out: str) -> None:
    from celery import signals

    import bench.lifecycle_tasks  # noqa: F401 - registers the task
    from jobsapp.celery_app import app

    profile, seen, started = cProfile.Profile(time.process_time), [0], [0.0, 0.0]

    @signals.task_postrun.connect(weak=False)
    def counted(**_: Any) -> None:
        seen[0] += 1
        if seen[0] == WARM:
            started[:] = [time.perf_counter(), time.process_time()]
        elif seen[0] == WARM + n:
            started[:] = [time.perf_counter() - started[0], time.process_time() - started[1]]
            profile.enable()
        elif seen[0] == WARM + 2 * n:
            profile.disable()
            os.kill(os.getpid(), signal.SIGTERM)  # a warm shutdown: the last ack goes out

    with contextlib.suppress(SystemExit):
        app.worker_main(
            [
                "worker",
                "-P",
                "solo",
                "-l",
                "warning",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        )
    if seen[0] < WARM + 2 * n:
        raise SystemExit(f"worker stopped after {seen[0]} of {WARM + 2 * n} jobs")
    report(profile, n, started[0], started[1], out)


SIDES: dict[str, Callable[[int, str], None]] = {"producer": producer, "worker": worker}

if __name__ == "__main__":
    SIDES[sys.argv[1]](int(sys.argv[2]), sys.argv[3])
