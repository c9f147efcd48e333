"""A newcomer's worker: no environment at all, everything embedded under ./var/."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.env import bare_env

CELERY = [sys.executable, "-m", "celery", "-A", "jobsapp"]


@pytest.fixture
def embedded_worker(tmp_path: Path) -> Iterator[Path]:
    # The one setup step a worker asks for (exit 11 and the command, docs/errors.md).
    subprocess.run(
        [sys.executable, "-m", "jobsapp.cli", "db", "upgrade"],
        cwd=tmp_path,
        env=bare_env(),
        check=True,
        capture_output=True,
        timeout=60,
    )
    log = (tmp_path / "worker.log").open("w")
    proc = subprocess.Popen(
        [*CELERY, "worker", "--pool=solo", "-l", "info", "--without-gossip", "--without-mingle"],
        cwd=tmp_path,
        env=bare_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield tmp_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_worker_starts_with_no_env_and_answers_ping(embedded_worker: Path) -> None:
    deadline = time.monotonic() + 40
    answer = ""
    while time.monotonic() < deadline:
        ping = subprocess.run(
            [*CELERY, "inspect", "ping", "-t", "3"],
            cwd=embedded_worker,
            env=bare_env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        answer = ping.stdout + ping.stderr
        if ping.returncode == 0 and "pong" in answer:
            break
        time.sleep(1)
    assert "pong" in answer, (embedded_worker / "worker.log").read_text()[-3000:]
    assert (embedded_worker / "var" / "broker").is_dir()
