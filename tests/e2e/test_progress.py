"""Long operator commands: a bar on a terminal, plain lines in a pipe."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from sqlalchemy import Engine

from jobsapp.storage.local import LocalObjectStore
from tests.support.planted import plant_ready

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(pg: Engine, tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}
    return base | {
        "JOBSAPP_VAR_DIR": str(tmp_path / "var"),
        "JOBSAPP_DATABASE_URL": pg.url.render_as_string(hide_password=False),
        # Published messages go nowhere: this test reads the command's output only.
        "JOBSAPP_BROKER_URL": "memory://",
        "JOBSAPP_STORAGE_URL": f"file://{tmp_path / 'objects'}",
    }


def on_terminal(argv: list[str], env: Mapping[str, str]) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal as its stdout, as a person's shell would."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=subprocess.PIPE,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(timeout=60), b"".join(chunks).decode(errors="replace")


def test_reprocess_draws_a_bar_on_a_terminal(
    pg: Engine, env: dict[str, str], tmp_path: Path
) -> None:
    plant_ready(pg, LocalObjectStore(tmp_path / "objects"), 6)
    argv = [str(BIN / "jobsapp"), "reprocess", "--to-version", "2", "--batch", "2"]

    code, screen = on_terminal(argv, env)

    assert code == 0, screen
    assert "reprocess to v2" in screen
    assert "━" in screen  # the bar
    assert "6/6" in screen
    assert "enqueued 2/6" not in screen  # no plain step lines on a terminal


def test_reprocess_prints_plain_lines_into_a_pipe(
    pg: Engine, env: dict[str, str], tmp_path: Path
) -> None:
    plant_ready(pg, LocalObjectStore(tmp_path / "objects"), 6)
    argv = [str(BIN / "jobsapp"), "reprocess", "--to-version", "2", "--batch", "2"]

    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(" (")[0] for line in lines[:3]] == [
        "enqueued 2/6",
        "enqueued 4/6",
        "enqueued 6/6",
    ]
    assert lines[3].startswith("done: 6 attachments to v2")
    assert "\x1b[" not in done.stdout


def test_a_maintenance_pass_by_hand_shows_it_is_working_on_a_terminal(env: dict[str, str]) -> None:
    argv = [str(BIN / "jobsapp"), "maintenance", "run-once", "--pass", "retention"]

    code, screen = on_terminal(argv, env)

    assert code == 0, screen
    assert "maintenance: retention" in screen
    assert '{"pass": "retention"' in screen
