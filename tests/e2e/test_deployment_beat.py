"""A team's first deploy adds its own periodic task the Celery way, and maintenance keeps
running: a real ``celery -A jobsapp beat`` on the embedded default, in a folder holding the
deployment's ``celeryconfig.py`` (or a task module that assigns ``app.conf.beat_schedule``,
as docs/periodic.md shows, or adds it in Celery's documented ``on_after_configure``
receiver), runs every maintenance pass and the deployment's entry, and
``jobsapp maintenance leader`` says so."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.env import shell_env
from tests.support.waiting import eventually

JOBSAPP = [sys.executable, "-m", "jobsapp.cli"]
BEAT = [sys.executable, "-m", "celery", "-A", "jobsapp", "beat", "-l", "info"]
RATES = '{"refresh-rates": {"task": "deploy.refresh_rates", "schedule": 1.0}}'
# Celery's documented receiver: jobsapp's app is configured before this module is
# imported, and Celery calls no receiver connected after that.
AFTER_CONFIGURE = """from jobsapp.celery_app import app


@app.on_after_configure.connect
def setup_periodic_tasks(sender, **kwargs):
    rates = sender.signature("deploy.refresh_rates")
    sender.add_periodic_task(1.0, rates, name="refresh-rates")
"""
WAYS = {
    "celeryconfig": ("celeryconfig.py", f"beat_schedule = {RATES}\n"),
    "app-conf": (
        "deploy_tasks.py",
        f"from jobsapp.celery_app import app\n\napp.conf.beat_schedule = {RATES}\n",
    ),
    "on-after-configure": ("deploy_tasks.py", AFTER_CONFIGURE),
}

pytestmark = pytest.mark.timeout(90)


def env() -> dict[str, str]:
    return shell_env(JOBSAPP_BEAT_LEASE_SECONDS="3", PYTHONPATH=".")


def jobsapp(folder: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*JOBSAPP, *args],
        cwd=folder,
        env={**env(), **extra},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(params=sorted(WAYS))
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    name, text = WAYS[request.param]
    (tmp_path / name).write_text(text)
    imports = {} if name == "celeryconfig.py" else {"JOBSAPP_IMPORTS": "deploy_tasks"}
    assert jobsapp(tmp_path, "db", "upgrade").returncode == 0
    log = tmp_path / "beat.log"
    with log.open("w") as out:
        beat = subprocess.Popen(
            BEAT, cwd=tmp_path, env={**env(), **imports}, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield tmp_path, log
    finally:
        beat.terminate()
        try:
            beat.wait(timeout=15)
        except subprocess.TimeoutExpired:
            # What these tests check is the schedule; beat's prompt stop on SIGTERM is
            # tests/integration/test_beat_shutdown.py's.
            beat.kill()
            beat.wait(timeout=10)


def test_beat_runs_every_maintenance_pass_beside_the_deployments_entry(
    deployment: tuple[Path, Path],
) -> None:
    folder, log = deployment

    said: list[str] = []

    def healthy() -> bool:
        checked = jobsapp(folder, "maintenance", "leader")
        said.append(checked.stdout + checked.stderr)
        return checked.returncode == 0

    try:
        # Each check is a process of its own: first the beat's line that it leads.
        eventually(lambda: "is the leader" in log.read_text(), timeout=45, interval=0.2)
        eventually(healthy, timeout=45, interval=1.0)
    except AssertionError:
        raise AssertionError(f"{said[-1:]}\n{log.read_text()[-3000:]}") from None
    assert "maintenance passes on time" in said[-1]
    assert eventually(lambda: "Sending due task refresh-rates" in log.read_text(), timeout=30)


def test_a_schedule_that_removes_a_pass_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "celeryconfig.py").write_text('beat_schedule = {"reaper": None}\n')
    beat = subprocess.run(
        BEAT, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert beat.returncode == 2, beat.stdout + beat.stderr
    lines = beat.stderr.strip().splitlines()
    assert len(lines) == 1, beat.stderr
    assert "'reaper' would stop jobsapp.maintenance.reaper" in lines[0]
