"""`jobsapp --version` names the installed package's version, as an operator types it."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path


def test_the_command_prints_the_installed_version() -> None:
    command = Path(sys.executable).with_name("jobsapp")
    reply = subprocess.run(
        [str(command), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert reply.returncode == 0, reply.stderr
    assert reply.stdout.split() == ["jobsapp", version("jobsapp")]
