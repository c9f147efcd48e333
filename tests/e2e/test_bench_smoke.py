"""Every benchmark still runs: ``python -m bench all --smoke`` (tiny sizes, its own servers).

Nothing here is asserted on time: the figures of a smoke run on a shared machine mean
nothing. What a user of the bench checks is asserted: it exits 0, prints every ratio
line with a number, writes its plots, and leaves none of its servers running.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PORTS = 9  # bench/services.py: postgres x2, redis, s3, weed x4, gunicorn
SYSTEMS = ("bare+events", "naive", "lifecycle", "lifecycle-batch", "procrastinate")
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


@pytest.fixture
def state_dir() -> Iterator[Path]:
    # Under the repository, not /tmp: the postgres user must be able to reach it.
    path = ROOT / "var" / f"bench-smoke-{os.getpid()}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(900)
def test_every_benchmark_runs_and_prints_its_ratios(state_dir: Path, tmp_path: Path) -> None:
    base = _port_base()
    run = subprocess.run(
        [sys.executable, "-m", "bench", "all", "--smoke", "--port-base", str(base),
         "--state-dir", str(state_dir), "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=850, check=False,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-5000:]
    ratios = run.stdout.split("==== ratios", 1)[1]
    expected = [f"{re.escape(system)}/bare {field} ratio \\(fsync {fsync}\\): {NUMBER}"
                for system in SYSTEMS for field in ("e2e", "enqueue", "drain")
                for fsync in ("on", "off")]  # fmt: skip
    expected += [f"upload capacity \\(uploads/s ready\\): {NUMBER}",
                 f"upload p99/idle service time ratio \\(80% load\\): {NUMBER}",
                 f"maintenance reaper 2,000/1,000 rows ratio: {NUMBER}"]  # fmt: skip
    assert "==== images (smoke)" in run.stdout
    missing = [line for line in expected if not re.search(line, ratios)]
    assert not missing, f"missing ratio lines {missing} in:\n{ratios}"
    assert {p.name for p in tmp_path.glob("*.png")} >= {"lifecycle.png", "upload.png",
                                                          "maintenance.png"}  # fmt: skip
    listening = [base + i for i in range(PORTS) if not _free(base + i)]
    assert not listening, f"bench servers still listening on {listening}"
