"""`jobsapp demo` as a newcomer runs it: a fresh folder, no JOBSAPP_* variable, no server."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.env import bare_env

VARIANTS = ("thumbnail", "crop", "optimized")
SAMPLES = 3


def run_demo(cwd: Path) -> tuple[int, str]:
    # Its own session, so that the worker the demo starts dies with it whatever happens.
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobsapp.cli", "demo", "--timeout", "60"],
        cwd=cwd,
        env=bare_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=120)
        return proc.returncode, output
    finally:
        # Normally the demo and its worker are gone already: nothing left to kill.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_demo_takes_three_images_to_ready_and_leaves_their_variants_on_disk(
    tmp_path: Path,
) -> None:
    code, output = run_demo(tmp_path)

    assert code == 0, output
    assert "the same id" in output
    # Each variant line ends with the file's path: what a newcomer would open.
    shown = [Path(line.rsplit(" ", 1)[-1]) for line in output.splitlines() if "/v1/" in line]
    assert sorted(path.name for path in shown) == sorted(VARIANTS * SAMPLES), output
    for path in shown:
        assert path.is_relative_to(tmp_path / "var")
        head = path.read_bytes()[:12]
        assert head[:4] == b"RIFF"
        assert head[8:12] == b"WEBP"


def test_demo_writes_nothing_outside_its_var_folder(tmp_path: Path) -> None:
    code, output = run_demo(tmp_path)

    assert code == 0, output
    # What a newcomer finds next to their checkout: one folder, which .gitignore covers.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["var"]
