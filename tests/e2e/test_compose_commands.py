"""Every jobsapp service of docker-compose.yml, run as a real process with its compose
environment, against the project's services (no Docker engine runs here).

Compose's own images (postgres, redis, minio) are stood in for by the test services: the
environment is rewritten only where it names their hosts (``postgres:5432``, ``redis``,
``minio:9000``) and where the container's ports would collide on this machine. The
secrets are the test servers' own, given to compose as an operator would. ``migrate``
runs first and must exit 0; then web, worker, beat and flower run their compose command
lines and each must pass its own compose health check.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from sqlalchemy import create_engine, inspect

from tests.support.compose import SECRETS, compose_services, unescaped
from tests.support.databases import drop_postgres, fresh_postgres
from tests.support.env import SESSION, service
from tests.support.procs import Launcher, Proc, ready
from tests.support.servers import RedisServer
from tests.support.webserver import Http, fetch, free_port
from tests.unit import images

DATABASE = f"jobsapp_compose_{SESSION}"
PROCESSES = ("web", "worker", "beat", "flower")
HEALTHY_WITHIN_S = 120


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # The S3 secrets are the test server's, so AWS_* pass through compose unchanged.
    secrets = SECRETS | {
        "S3_ACCESS_KEY": service("AWS_ACCESS_KEY_ID"),
        "S3_SECRET_KEY": service("AWS_SECRET_ACCESS_KEY"),
    }
    return compose_services(tmp_path_factory.mktemp("docker"), secrets)


@pytest.fixture
def stand_ins(module_redis: RedisServer) -> Iterator[dict[str, str]]:
    """What replaces compose's postgres, redis and minio hosts in the environment."""
    admin = service("JOBSAPP_TEST_DATABASE_URL")
    broker = module_redis.url
    module_redis.client().flushdb()
    s3 = service("JOBSAPP_TEST_S3_ENDPOINT_URL")
    yield {
        "JOBSAPP_DATABASE_URL": fresh_postgres(admin, DATABASE),
        "JOBSAPP_BROKER_URL": broker,
        "JOBSAPP_REDIS_URL": broker,
        "JOBSAPP_S3_ENDPOINT_URL": s3,
        # The browser's name for the same server, as localhost:9000 is for minio:9000.
        "JOBSAPP_S3_PUBLIC_URL": urlsplit(s3)
        ._replace(netloc=f"localhost:{urlsplit(s3).port}")
        .geturl(),
        "JOBSAPP_STORAGE_URL": f"s3://{service('JOBSAPP_TEST_S3_BUCKET')}/compose-{uuid.uuid4()}",
    }
    drop_postgres(admin, DATABASE)


@pytest.fixture
def ports() -> dict[str, str]:
    """Container ports as written in compose -> free loopback ports here."""
    web, flower = free_port(), free_port()
    return {
        "0.0.0.0:8000": f"127.0.0.1:{web}",
        "127.0.0.1:8000": f"127.0.0.1:{web}",
        "--address=0.0.0.0": "--address=127.0.0.1",
        "--port=5555": f"--port={flower}",
        "127.0.0.1:5555": f"127.0.0.1:{flower}",
    }


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JOBSAPP_", "FLOWER_"))}
    # As in a container: the image's commands on PATH, and HOSTNAME set (the worker's
    # health check pings celery@$HOSTNAME).
    env = base | {
        "PATH": f"{Path(sys.executable).parent}:{base.get('PATH', '')}",
        "HOSTNAME": socket.gethostname(),
        "JOBSAPP_VAR_DIR": str(tmp_path / "var"),
    }
    launched = Launcher(env, tmp_path)
    yield launched
    launched.kill_all()
    launched.dump_logs()


def _local(words: list[str], ports: dict[str, str]) -> list[str]:
    return [_localised(word, ports) for word in unescaped(words)]


def _localised(word: str, ports: dict[str, str]) -> str:
    for container, here in ports.items():
        word = word.replace(container, here)
    return word


def _env(
    compose_env: dict[str, str | None], stand_ins: dict[str, str], ports: dict[str, str]
) -> dict[str, str]:
    """A service's environment here: stand-ins for its servers, its ports made local
    (``JOBSAPP_WEB_BIND: 0.0.0.0:8000`` is where gunicorn binds)."""
    return {k: _localised(v or "", ports) for k, v in compose_env.items()} | stand_ins


def _health_argv(check: list[str], ports: dict[str, str]) -> list[str]:
    kind, *rest = _local(check, ports)
    return ["sh", "-c", rest[0]] if kind == "CMD-SHELL" else rest


def _wait_healthy(proc: Proc, check: list[str], env: dict[str, str], cwd: Path) -> None:
    deadline = time.monotonic() + HEALTHY_WITHIN_S
    while True:
        assert proc.alive(), f"{proc.name} exited:\n{proc.log()[-3000:]}"
        result = subprocess.run(
            check, env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False
        )
        if result.returncode == 0:
            return
        assert time.monotonic() < deadline, (
            f"{proc.name}'s health check {check} still fails: {result.stderr[-2000:]}\n"
            f"{proc.log()[-3000:]}"
        )
        time.sleep(1)


def test_every_compose_service_command_runs_and_passes_its_health_check(
    services: dict[str, Any],
    stand_ins: dict[str, str],
    ports: dict[str, str],
    launcher: Launcher,
    tmp_path: Path,
) -> None:
    migrate = services["migrate"]
    done = subprocess.run(
        migrate["command"],
        env=launcher.env | _env(migrate["environment"], stand_ins, ports),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    engine = create_engine(stand_ins["JOBSAPP_DATABASE_URL"])
    assert "attachments" in inspect(engine).get_table_names()
    engine.dispose()

    procs = {}
    for name in PROCESSES:
        env = _env(services[name]["environment"], stand_ins, ports)
        procs[name] = launcher.start(name, _local(services[name]["command"], ports), env)
    for name, proc in procs.items():
        if name in ("worker", "beat"):
            # Their checks are processes of their own (the worker's ping waits out its 10 s
            # timeout on a worker still starting): first the line that says it is up.
            ready(proc, timeout=HEALTHY_WITHIN_S)
        env = launcher.env | _env(services[name]["environment"], stand_ins, ports)
        check = _health_argv(services[name]["healthcheck"]["test"], ports)
        _wait_healthy(proc, check, env, tmp_path)

    procs["beat"].wait_for_log("is the leader", timeout=30)
    _flower_needs_its_basic_auth(ports)
    _metrics_need_the_scrapers_token(ports)
    _an_upload_becomes_ready_with_a_public_sigv4_url(ports, stand_ins)


def _flower_needs_its_basic_auth(ports: dict[str, str]) -> None:
    flower = f"http://{ports['127.0.0.1:5555']}/"
    assert fetch(flower).status == 401
    token = base64.b64encode(SECRETS["FLOWER_BASIC_AUTH"].encode()).decode()
    request = urllib.request.Request(flower, headers={"Authorization": f"Basic {token}"})
    assert fetch(request).status == 200


def _metrics_need_the_scrapers_token(ports: dict[str, str]) -> None:
    web = Http(f"http://{ports['127.0.0.1:8000']}")
    bearer = {"Authorization": f"Bearer {SECRETS['JOBSAPP_METRICS_TOKEN']}"}
    for path in ("/metrics", "/metrics/cluster"):
        assert web.get(path).status == 401
        assert web.request(path, headers=bearer).status == 200


def _an_upload_becomes_ready_with_a_public_sigv4_url(
    ports: dict[str, str], stand_ins: dict[str, str]
) -> None:
    web = Http(f"http://{ports['127.0.0.1:8000']}", SECRETS["JOBSAPP_API_TOKEN"])
    reply = web.post_file(images.solid("PNG"), "p.png", "image/png")
    assert reply.status == 202, reply.body
    deadline = time.monotonic() + 90
    while (view := web.get(reply.headers["Location"]).json())["state"] not in ("ready", "failed"):
        assert time.monotonic() < deadline, view
        time.sleep(0.5)
    assert view["state"] == "ready", view
    variant = web.get(f"{reply.headers['Location']}/variants/thumbnail")
    assert variant.status == 302
    location = variant.headers["Location"]
    assert location.startswith(stand_ins["JOBSAPP_S3_PUBLIC_URL"] + "/")
    assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in location
    assert fetch(location).status == 200


def test_web_refuses_to_start_with_a_well_known_admin_token(
    services: dict[str, Any], stand_ins: dict[str, str], ports: dict[str, str], launcher: Launcher
) -> None:
    env = _env(services["web"]["environment"], stand_ins, ports)
    env["JOBSAPP_ADMIN_TOKEN"] = "change-me"
    web = launcher.start("web", _local(services["web"]["command"], ports), env)

    assert web.wait(timeout=90) != 0
    assert "JOBSAPP_ADMIN_TOKEN is a well-known placeholder" in web.log()
