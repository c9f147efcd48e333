"""Every benchmark still runs: ``python -m bench all --smoke`` (tiny sizes, its own servers).

Nothing here is asserted on time: the figures of a smoke run on a shared machine mean
nothing. What a user of the bench checks is asserted: it exits 0, prints every ratio
line with a number, writes its plots, and leaves none of its servers running. A smoke
run starts the fsync-on Postgres cluster alone, so its lifecycle lines are the fsync-on
ones (``--quick`` and the full run measure both clusters, and print the same lines for
each).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench import services

ROOT = Path(__file__).resolve().parents[2]
PORTS = 13  # bench/services.py: postgres x2, redis, s3, weed x4, gunicorn, pgbouncer, rabbitmq x3
# The lifecycle's closing lines: jobsapp against each peer (events as shipped on both sides
# where the line says nothing, else as it says), and its journal's rows per job.
LIFECYCLE = [
    *(f"lifecycle/bare {field} ratio (fsync on)" for field in ("e2e", "enqueue", "drain")),
    "lifecycle/bare e2e ratio (fsync on, events off)",
    "lifecycle/bare e2e ratio (fsync on, events on)",
    "lifecycle/naive e2e ratio (fsync on)",
    "lifecycle/procrastinate e2e ratio (fsync on)",
    "lifecycle-batch/bare e2e ratio (fsync on)",
    "lifecycle-batch/bare enqueue ratio (fsync on)",
    "bare+events/bare e2e ratio (fsync on)",
    "batch enqueue jobs per second",
    "batch enqueue/bare pipeline ratio (fsync on)",
    "lifecycle/bare worker calls per job",
    "lifecycle/bare solo worker calls per job",
    "lifecycle/bare producer calls per job",
    "lifecycle journal rows per job",
]
NUMBER = r"-?\d+(\.\d+)?"


def _free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _port_base() -> int:
    """A base whose ports (and S3's gRPC ports, +10000) nothing listens on."""
    for base in range(21000 + os.getpid() % 100 * 20, 23000, 20):
        ports = [base + i for i in range(PORTS)] + [base + i + 10000 for i in range(3, 8)]
        if all(_free(port) for port in ports):
            return base
    raise AssertionError("no free port range for the bench's servers")


@dataclass(frozen=True)
class Place:
    port_base: int
    state_dir: Path


@pytest.fixture
def place() -> Iterator[Place]:
    """Free ports, and a state dir under the repository (the postgres user must reach it,
    which it cannot under pytest's /tmp); whatever the bench leaves running is stopped."""
    spot = Place(_port_base(), ROOT / "var" / f"bench-smoke-{os.getpid()}")
    yield spot
    services.stop(spot.port_base, spot.state_dir / "servers")
    shutil.rmtree(spot.state_dir, ignore_errors=True)


@pytest.fixture
def places(place: Place) -> Iterator[tuple[Place, Place]]:
    """Two places side by side: ``place`` and one 40 ports above it."""
    other = Place(place.port_base + 40, place.state_dir.with_name(place.state_dir.name + "-b"))
    assert not _listening(other.port_base), "the second bench's ports are taken"
    yield place, other
    services.stop(other.port_base, other.state_dir / "servers")
    shutil.rmtree(other.state_dir, ignore_errors=True)


def _bench(place: Place, out: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench",
        *args,
        "--port-base",
        str(place.port_base),
        "--state-dir",
        str(place.state_dir),
        "--out",
        str(out),
    ]


def _listening(base: int) -> list[int]:
    return [base + i for i in range(PORTS) if not _free(base + i)]


# Two bench processes at once, each on servers of its own, so the smoke run takes as long as
# its longer half (about two minutes each) rather than both.
HALVES = (
    ("lifecycle", "images", "upload", "profile"),
    ("scale", "maintenance", "limits", "flow", "growth"),
)


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str


def _both_halves(places: tuple[Place, Place], out: Path) -> Finished:
    running = [
        subprocess.Popen(
            _bench(spot, out, *half, "--smoke"),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for spot, half in zip(places, HALVES, strict=True)
    ]
    done = [(proc, *proc.communicate(timeout=850)) for proc in running]
    return Finished(
        next((proc.returncode for proc, _, _ in done if proc.returncode), 0),
        "".join(out for _, out, _ in done),
        "".join(err for _, _, err in done),
    )


@pytest.mark.timeout(900)
def test_every_benchmark_runs_and_prints_its_ratios(
    places: tuple[Place, Place], tmp_path: Path
) -> None:
    run = _both_halves(places, tmp_path)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-5000:]
    ratios = run.stdout.split("==== ratios", 1)[1]
    expected = [f"{re.escape(line)}: {NUMBER}" for line in LIFECYCLE]
    expected += [
        f"upload capacity \\(uploads/s ready\\): {NUMBER}",
        f"upload p99/idle service time ratio \\(80% load\\): {NUMBER}",
        f"maintenance reaper 2,000/1,000 rows ratio: {NUMBER}",
        f"scale redis 2/1 workers throughput ratio: {NUMBER}",
        f"scale rabbitmq-quorum 2/1 workers throughput ratio: {NUMBER}",
        "scale every job ran once \\(PgBouncer transaction pooling\\): True",
        f"profile producer CPU ms/job \\(here\\): {NUMBER}",
        f"profile worker CPU ms/job \\(here\\): {NUMBER}",
        f"limits: enqueue\\+claim\\+finish ms/job \\(fsync on, .*\\): no limit {NUMBER}, "
        f"limit=3, slot free {NUMBER}, limit=3, waiting in line {NUMBER}; "
        f"a limit check costs [+-]{NUMBER} ms/job",
        f"fairness: enqueue\\+claim\\+finish ms/job \\(fsync on, .*\\): plain {NUMBER}, "
        f"fair, one key's backlog {NUMBER}; a round-robin claim costs [+-]{NUMBER} ms/job",
        f"flow: a claim with a rate check {NUMBER} ms/job vs {NUMBER} ms/job with no "
        f"limit \\({NUMBER}x; fsync on\\)",
        f"priorities: enqueue\\+relay publish ms/job \\(fsync on, .*\\): no priority "
        f"{NUMBER}, priorities 0-9 {NUMBER}; a priority costs [+-]{NUMBER} "
        "ms/job",
    ]
    expected += [
        f"growth {figure} ratio: {NUMBER}"
        for figure in (
            "overview",
            "task filter",
            "search no match",
            "charts day",
            "metrics cluster",
            "summary",
            "retention",
            "rollup caught up",
            "hot path 50 jobs",
        )
    ]
    expected += [
        f"growth rollup successes per second: {NUMBER}",
        "growth workflow steps without a run after retention: 0",
    ]
    assert "==== images (smoke)" in run.stdout
    expected += [
        f"images: jobsapp/{peer} \\d+MP JPEG ratio: {NUMBER}" for peer in ("naive", "pyvips")
    ]
    missing = [line for line in expected if not re.search(line, ratios)]
    assert not missing, f"missing ratio lines {missing} in:\n{ratios}"
    plotted = {p.name for p in tmp_path.glob("*.png")}
    assert plotted >= {"lifecycle.png", "upload.png", "maintenance.png", "scale.png"}
    assert not [p for p in places if _listening(p.port_base)], "bench servers still listening"


def test_a_terminated_bench_stops_its_servers(place: Place, tmp_path: Path) -> None:
    """SIGTERM (a CI timeout, a supervisor, kill) mid-run leaves no server behind."""
    bench = subprocess.Popen(
        _bench(place, tmp_path, "lifecycle", "--smoke"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert bench.stdout is not None
    seen = []
    for line in bench.stdout:  # the servers are up once the benchmark starts
        seen.append(line)
        if line.startswith("==== lifecycle"):
            break
    assert _listening(place.port_base), "".join(seen)
    bench.send_signal(signal.SIGTERM)
    rest, _ = bench.communicate(timeout=120)
    assert not _listening(place.port_base), f"bench servers still listening:\n{rest}"
    assert bench.returncode == 128 + signal.SIGTERM, "".join(seen) + rest
