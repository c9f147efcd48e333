"""The Procfile runs the whole system under honcho: its ``release`` line migrates a fresh
database, then gunicorn web (on ``$PORT``, as a platform sets it), worker, beat and Flower."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.databases import drop_postgres, fresh_postgres
from tests.support.env import SESSION, service
from tests.support.servers import RedisServer
from tests.support.webserver import API_TOKEN, REPO, Http, fetch, free_port
from tests.unit import images

FLOWER_LOGIN = "ops:procfile-Secret-2f9a"
# The long-running lines; ``release`` runs once, before them, as a platform runs it.
PROCESSES = ("web", "worker", "beat", "flower")


@pytest.fixture
def procfile_env(module_redis: RedisServer, tmp_path: Path) -> Iterator[dict[str, str]]:
    admin = service("JOBSAPP_TEST_DATABASE_URL")
    # As a platform's DATABASE_URL is written (Heroku, Render): postgres://, not SQLAlchemy's.
    db_url = fresh_postgres(admin, f"jobsapp_e2e_procfile_{SESSION}")
    db_url = "postgres://" + db_url.split("://", 1)[1]
    broker = module_redis.url
    module_redis.client().flushdb()
    base = {k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}
    env = base | {
        "PATH": f"{Path(sys.executable).parent}:{base.get('PATH', '')}",
        "JOBSAPP_VAR_DIR": str(tmp_path / "var"),
        "JOBSAPP_DATABASE_URL": db_url,
        "JOBSAPP_BROKER_URL": broker,
        "JOBSAPP_STORAGE_URL": f"file://{tmp_path / 'objects'}",
        "PORT": str(free_port()),
        "JOBSAPP_FLOWER_PORT": str(free_port()),
        "JOBSAPP_RELAY_EVERY": "1",
        "FLOWER_BASIC_AUTH": FLOWER_LOGIN,
        "JOBSAPP_API_TOKEN": API_TOKEN,
    }
    # The platform's release phase, before any process starts: the Procfile's own line.
    release = subprocess.run(
        [str(Path(sys.executable).parent / "honcho"), "start", "-f", "Procfile", "release"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    said = release.stdout + release.stderr
    assert release.returncode == 0, said
    assert "database at head" in said
    # The migrations it ran, and none of Alembic's set-up chatter ("setup plugin ...").
    assert "Running upgrade  -> 0001" in said
    assert "plugin" not in said, said
    yield env
    drop_postgres(admin, f"jobsapp_e2e_procfile_{SESSION}")


@pytest.fixture
def honcho(procfile_env: dict[str, str], tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "honcho.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "honcho"), "start", "-f", "Procfile", *PROCESSES],
            cwd=REPO,
            env=procfile_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield log
    finally:
        # honcho passes SIGTERM on to every line; what outlives it is killed with its group.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _answers(url: str, log: Path, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return fetch(url).status
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} never answered:\n{log.read_text()[-4000:]}")


def test_every_procfile_line_serves(honcho: Path, procfile_env: dict[str, str]) -> None:
    web = Http(f"http://127.0.0.1:{procfile_env['PORT']}", API_TOKEN)
    assert _answers(web.base_url + "/healthz", honcho) == 200
    flower = f"http://127.0.0.1:{procfile_env['JOBSAPP_FLOWER_PORT']}/"
    assert _answers(flower, honcho) == 401
    login = base64.b64encode(FLOWER_LOGIN.encode()).decode()
    assert (
        fetch(urllib.request.Request(flower, headers={"Authorization": f"Basic {login}"})).status
        == 200
    )
    reply = web.post_file(images.solid("PNG"), "p.png", "image/png")
    assert reply.status == 202, reply.body
    location = reply.headers["Location"]
    deadline = time.monotonic() + 60
    while (state := web.get(location).json()["state"]) not in ("ready", "failed"):
        assert time.monotonic() < deadline, honcho.read_text()[-4000:]
        time.sleep(0.3)
    assert state == "ready"
    log = honcho.read_text()
    assert "is the leader" in log  # beat took its lease


@pytest.mark.parametrize("login", [None, ""])
def test_flower_refuses_to_start_without_its_basic_auth(login: str | None) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JOBSAPP_", "FLOWER_"))}
    port = free_port()
    env = base | {
        "PATH": f"{Path(sys.executable).parent}:{base.get('PATH', '')}",
        "JOBSAPP_FLOWER_PORT": str(port),
    }
    if login is not None:
        env["FLOWER_BASIC_AUTH"] = login
    argv = [str(Path(sys.executable).parent / "honcho"), "start", "-f", "Procfile", "flower"]
    done = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False
    )

    assert done.returncode != 0
    output = (done.stdout + done.stderr).splitlines()
    said = [line for line in output if "FLOWER_BASIC_AUTH" in line]
    assert len(said) == 1, output
    assert "set FLOWER_BASIC_AUTH to user:password" in said[0]
    # Nothing listens: Flower never started.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
