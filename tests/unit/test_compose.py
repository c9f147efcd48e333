"""docker-compose.yml, as the real Compose v2 binary resolves it: valid, no default secrets,
the Procfile's commands, health checks, restart policies and start order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.compose import (
    REPO,
    SECRETS,
    compose_services,
    procfile,
    procfile_argv,
    run_compose,
)

JOBSAPP_PROCESSES = ("web", "worker", "beat", "flower")
LONG_RUNNING = (*JOBSAPP_PROCESSES, "postgres", "redis", "minio")


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return compose_services(tmp_path_factory.mktemp("docker"), SECRETS)


def test_compose_file_is_valid(tmp_path: Path) -> None:
    result = run_compose(tmp_path, SECRETS, "config", "--quiet")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_a_missing_secret_stops_compose_and_is_named(tmp_path: Path, secret: str) -> None:
    env = {name: value for name, value in SECRETS.items() if name != secret}
    result = run_compose(tmp_path, env, "config", "--quiet")
    assert result.returncode != 0
    assert secret in result.stderr


def test_secrets_reach_the_processes_only_from_the_operator(services: dict[str, Any]) -> None:
    env = services["web"]["environment"]
    assert env["AWS_SECRET_ACCESS_KEY"] == SECRETS["S3_SECRET_KEY"]
    assert f":{SECRETS['POSTGRES_PASSWORD']}@" in env["JOBSAPP_DATABASE_URL"]
    # Unset admin token: the operator API stays off (no "change-me" fallback).
    assert env["JOBSAPP_ADMIN_TOKEN"] == ""
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"] == SECRETS["FLOWER_BASIC_AUTH"]


@pytest.mark.parametrize("name", JOBSAPP_PROCESSES)
def test_each_process_runs_its_procfile_line(services: dict[str, Any], name: str) -> None:
    service = services[name]
    assert service["command"] == procfile_argv(procfile()[name], service["environment"])


def test_the_procfile_has_no_process_compose_lacks() -> None:
    assert set(procfile()) == {*JOBSAPP_PROCESSES, "release"}


def test_the_procfile_release_line_is_composes_migrate(services: dict[str, Any]) -> None:
    migrate = services["migrate"]
    assert migrate["command"] == procfile_argv(procfile()["release"], migrate["environment"])


@pytest.mark.parametrize(
    ("env", "bind"),
    [
        ({}, "127.0.0.1:8000"),
        ({"PORT": "5123"}, "0.0.0.0:5123"),
        ({"PORT": "5123", "JOBSAPP_WEB_BIND": "127.0.0.1:9000"}, "127.0.0.1:9000"),
    ],
    ids=["developer", "platform-port", "explicit-bind"],
)
def test_web_binds_where_the_platform_says(env: dict[str, str], bind: str) -> None:
    from jobsapp.web.gunicorn_conf import web_bind

    assert web_bind(env) == bind


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_long_running_services_have_a_health_check_and_restart(
    services: dict[str, Any], name: str
) -> None:
    assert services[name]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")
    assert services[name]["restart"] == "unless-stopped"


@pytest.mark.parametrize("name", JOBSAPP_PROCESSES)
def test_processes_start_after_migrate_completes(services: dict[str, Any], name: str) -> None:
    depends = services[name]["depends_on"]
    assert depends["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["command"] == ["jobsapp", "db", "upgrade"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_flower_is_published_on_loopback_only(services: dict[str, Any]) -> None:
    (port,) = services["flower"]["ports"]
    assert port["host_ip"] == "127.0.0.1"


def test_presigned_urls_name_a_public_s3_address(services: dict[str, Any]) -> None:
    env = services["web"]["environment"]
    assert env["JOBSAPP_S3_ENDPOINT_URL"] == "http://minio:9000"
    assert env["JOBSAPP_S3_PUBLIC_URL"] == "http://localhost:9000"


def test_rabbitmq_runs_only_in_its_profile(tmp_path: Path, services: dict[str, Any]) -> None:
    assert "rabbitmq" not in services
    with_rabbit = compose_services(tmp_path, SECRETS, "--profile", "rabbitmq")
    assert with_rabbit["rabbitmq"]["healthcheck"]["test"][0] == "CMD"


def test_the_sso_profile_puts_oauth2_proxy_in_front_of_web_from_the_address_web_trusts(
    tmp_path: Path, services: dict[str, Any]
) -> None:
    assert "oauth2-proxy" not in services
    assert services["web"]["environment"]["JOBSAPP_AUTH_PROXY_HEADER"] == ""
    sso = {
        "JOBSAPP_AUTH_PROXY_HEADER": "X-Forwarded-Email",
        "JOBSAPP_AUTH_PROXY_TRUSTED": "172.30.57.10/32",
    }
    found = compose_services(tmp_path, SECRETS | sso, "--profile", "sso")
    proxy = found["oauth2-proxy"]
    assert proxy["environment"]["OAUTH2_PROXY_UPSTREAMS"] == "http://web:8000/"
    address = proxy["networks"]["sso"]["ipv4_address"]
    assert found["web"]["environment"]["JOBSAPP_AUTH_PROXY_TRUSTED"] == f"{address}/32"
    assert "sso" in found["web"]["networks"]


def test_web_is_published_on_loopback_unless_the_deployer_says_otherwise(
    tmp_path: Path, services: dict[str, Any]
) -> None:
    (port,) = services["web"]["ports"]
    assert (port["host_ip"], port["published"], port["target"]) == ("127.0.0.1", "8000", 8000)
    public = compose_services(tmp_path, SECRETS | {"WEB_PUBLISH": "0.0.0.0:8080"})
    (port,) = public["web"]["ports"]
    assert (port["host_ip"], port["published"]) == ("0.0.0.0", "8080")  # noqa: S104


def test_every_published_port_binds_to_loopback(services: dict[str, Any]) -> None:
    published = [
        (name, port) for name, service in services.items() for port in service.get("ports", [])
    ]
    assert published
    assert all(port["host_ip"] == "127.0.0.1" for _, port in published), published


def test_web_metrics_need_the_scrapers_token(services: dict[str, Any]) -> None:
    env = services["web"]["environment"]
    assert env["JOBSAPP_METRICS_TOKEN"] == SECRETS["JOBSAPP_METRICS_TOKEN"]


def test_web_uploads_and_reads_need_the_producers_token(services: dict[str, Any]) -> None:
    assert services["web"]["environment"]["JOBSAPP_API_TOKEN"] == SECRETS["JOBSAPP_API_TOKEN"]


def test_redis_keeps_its_data_on_a_volume(services: dict[str, Any]) -> None:
    (mount,) = services["redis"]["volumes"]
    assert (mount["type"], mount["source"], mount["target"]) == ("volume", "redisdata", "/data")
    assert "--appendonly" in services["redis"]["command"]


def test_env_example_names_every_secret_compose_requires() -> None:
    example = (REPO / ".env.example").read_text()
    for secret in SECRETS:
        assert f"\n{secret}=" in example, secret
