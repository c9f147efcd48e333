"""Credentials in errors never reach the journal, the API or the logs.

Real processes on real services: ``jobsapp web`` (with the admin API on) and a
``celery -A jobsapp worker``; a second worker whose S3 secret key is wrong refuses to start
(its start-up check) with one line that names the setting, never the key. A test task fails with a
database URL, an ``AWS_SECRET_ACCESS_KEY=...`` assignment, a presigned S3 URL, a bearer
token and a URL with a password and an access token in its error text (first transient,
then permanent, each with a cause). Then everything a user or an operator can read is
searched for each secret: ``last_error`` and ``job_events.reason`` (and every other
journal column), the attachment as the API shows it, the admin JSON, page and metrics,
and the log files of both processes. The errors must still say what failed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import select

from jobsapp.attachments.models import ATTACHMENTS, RUNS
from jobsapp.lifecycle.journal import EVENTS, OUTBOX
from jobsapp.lifecycle.journal.tables import JobRun
from jobsapp.preflight import ExitCode
from tests.chaos.harness import (
    Cluster,
    cluster_for,
    create_database,
    drop_database,
    photo,
)
from tests.support.env import SESSION, service
from tests.support.procs import BIN, WORKER_FLAGS, Proc, ready
from tests.support.servers import RedisServer
from tests.support.tasks import planted_secrets
from tests.support.webserver import API_TOKEN, Http, free_port

pytestmark = pytest.mark.timeout(150)

JOB_RUNS = JobRun.__table__
ADMIN_TOKEN = f"adm-{uuid.uuid4().hex}"
# The worker signs its S3 requests with this: a wrong key, so S3 refuses every request.
WRONG_S3_SECRET = f"wr0ng-{uuid.uuid4().hex}"
# Retries of the attachment's storage errors are short enough to ride a countdown.
WORKER_SETTINGS = {"JOBSAPP_INLINE_WAIT_MAX": "60"}


@dataclass
class Deployment:
    cluster: Cluster
    broker: RedisServer
    web: Proc
    http: Http
    worker: Proc
    refused: Proc


@dataclass
class Story:
    """What ran: the leaky job, the attachment the worker could not read, the secrets."""

    deployment: Deployment
    token: str
    leaky_job: uuid.UUID
    attachment_id: uuid.UUID
    secrets: Mapping[str, str]


# ----------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def deployment(
    template_db: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    admin, template = template_db
    name = f"jobsapp_chaos_{SESSION}_secrets"
    url = create_database(admin, name, template)
    workdir = tmp_path_factory.mktemp("secrets")
    broker = RedisServer(workdir / "redis")
    broker.start()
    bucket = service("JOBSAPP_TEST_S3_BUCKET")
    prefix = f"chaos-secrets-{SESSION}-{uuid.uuid4().hex[:8]}"
    try:
        with cluster_for(
            prefix,
            database_url=url,
            broker=broker,
            storage_url=f"s3://{bucket}/{prefix}",
            s3_endpoint=service("JOBSAPP_TEST_S3_ENDPOINT_URL"),
            workdir=workdir,
        ) as cluster:
            web, http = start_web(cluster)
            worker = cluster.launcher.start(
                "worker",
                [str(BIN / "celery"), "-A", "jobsapp", "worker", *WORKER_FLAGS, "-n", "w@%h"],
                {
                    "JOBSAPP_IMPORTS": "tests.support.tasks",
                    "JOBSAPP_TEST_REDIS_URL": broker.url,
                    **WORKER_SETTINGS,
                },
            )
            ready(worker, timeout=45)
            refused = cluster.launcher.start(
                "refused-worker",
                [str(BIN / "celery"), "-A", "jobsapp", "worker", *WORKER_FLAGS, "-n", "r@%h"],
                {
                    "JOBSAPP_IMPORTS": "tests.support.tasks",
                    "JOBSAPP_TEST_REDIS_URL": broker.url,
                    "AWS_SECRET_ACCESS_KEY": WRONG_S3_SECRET,
                    **WORKER_SETTINGS,
                },
            )
            assert refused.popen.wait(timeout=60) == ExitCode.S3_ACCESS_DENIED
            yield Deployment(cluster, broker, web, http, worker, refused)
    finally:
        broker.close()
        drop_database(admin, name)


def start_web(cluster: Cluster) -> tuple[Proc, Http]:
    """``jobsapp web`` with the operator API on (its own token), once /healthz answers."""
    port = free_port()
    argv = [sys.executable, "-m", "jobsapp.cli", "web", "--host", "127.0.0.1", "--port", str(port)]
    proc = cluster.launcher.start("web", argv, {"JOBSAPP_ADMIN_TOKEN": ADMIN_TOKEN})
    http = Http(f"http://127.0.0.1:{port}", API_TOKEN)
    deadline = time.monotonic() + 30
    while True:
        assert proc.alive(), f"jobsapp web exited:\n{proc.log()[-3000:]}"
        with contextlib.suppress(OSError):
            if http.get("/healthz").status == 200:
                return proc, http
        assert time.monotonic() < deadline, f"jobsapp web not healthy:\n{proc.log()[-3000:]}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def story(deployment: Deployment) -> Story:
    cluster = deployment.cluster
    reply = deployment.http.post_file(photo(), "holiday.jpg", "image/jpeg")
    assert reply.status == 202, reply.body
    attachment_id = uuid.UUID(reply.json()["id"])
    token = uuid.uuid4().hex
    (enqueued,) = cluster.launcher.enqueue({"task": "tests.leaky", "kwargs": {"token": token}})
    leaky_job = uuid.UUID(enqueued["job_id"])
    cluster.wait_for(lambda: terminal(cluster, JOB_RUNS, leaky_job), "tests.leaky failed", 30)
    # Five attempts with backoff of about 2, 4, 8 and 16 s: about half a minute.
    cluster.wait_for(
        lambda: (a := cluster.attachment(attachment_id))["state"] == "ready" and a,
        "the attachment is ready",
        60,
    )
    secrets = {
        **{f"planted {k}": v for k, v in planted_secrets(token).items()},
        "wrong S3 secret key": WRONG_S3_SECRET,
        "real S3 secret key": os.environ["AWS_SECRET_ACCESS_KEY"],
        "admin token": ADMIN_TOKEN,
    }
    return Story(deployment, token, leaky_job, attachment_id, secrets)


# ------------------------------------------------------------------------ helpers


def terminal(cluster: Cluster, table: Any, job_id: uuid.UUID) -> dict[str, Any] | None:
    with cluster.engine.connect() as conn:
        row = conn.execute(select(table).where(table.c.job_id == job_id)).mappings().first()
    return dict(row) if row is not None and row["state"] in ("succeeded", "failed") else None


def table_rows(cluster: Cluster, table: Any) -> list[dict[str, Any]]:
    with cluster.engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(table)).mappings()]


def leaked(text: str, secrets: Mapping[str, str]) -> list[str]:
    """The names of the secrets ``text`` holds, as they are or percent-encoded."""
    return [
        name for name, value in secrets.items() if value in text or quote(value, safe="") in text
    ]


def admin_get(http: Http, path: str) -> tuple[int, str]:
    reply = http.request(path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    return reply.status, reply.body.decode(errors="replace")


# -------------------------------------------------------------------------- tests


def test_the_errors_are_recorded_readable_but_masked(story: Story) -> None:
    cluster = story.deployment.cluster
    row = terminal(cluster, JOB_RUNS, story.leaky_job)
    assert row is not None
    assert (row["state"], row["outcome"], row["attempts"]) == ("failed", "permanent", 2)
    error = row["last_error"]
    # What failed and where is still there; only the credentials are gone.
    assert "PermanentError" in error
    assert "X-Amz-Signature=***" in error
    assert "https://svc:***@api.example.com" in error
    assert "caused by OSError: connect to postgresql://app:***@db.internal:5432/jobs" in error
    reasons = [e["reason"] or "" for e in cluster.events(story.leaky_job)]
    retry = [r for r in reasons if r.startswith("ConnectionError")]
    assert len(retry) == 1
    assert "AWS_SECRET_ACCESS_KEY=***" in retry[0]


def test_a_worker_with_a_wrong_s3_secret_refuses_to_start_without_printing_it(
    story: Story,
) -> None:
    log = story.deployment.refused.log()
    assert "S3 access denied" in log
    assert "AWS_SECRET_ACCESS_KEY" in log
    assert leaked(log, story.secrets) == []
    assert " ready." not in log


@pytest.mark.parametrize(
    "table", [JOB_RUNS, RUNS, EVENTS, OUTBOX, ATTACHMENTS], ids=lambda t: t.name
)
def test_no_journal_row_holds_a_secret(story: Story, table: Any) -> None:
    text = "\n".join(repr(r) for r in table_rows(story.deployment.cluster, table))
    assert leaked(text, story.secrets) == []
    if table is JOB_RUNS:
        # The search does see what is there: the task's argument is kept in params.
        assert story.token in text


def test_no_api_answer_holds_a_secret(story: Story) -> None:
    http = story.deployment.http
    view = http.get(f"/v1/attachments/{story.attachment_id}")
    assert view.status == 200
    assert view.json()["state"] == "ready"
    answers = {"attachment": view.body.decode()}
    for path in (
        "/v1/admin/jobs?limit=1000",
        "/v1/admin/jobs?state=failed",
        "/admin",
        "/admin/jobs?state=failed",
        f"/admin/jobs/jobs/{story.leaky_job}",
        "/metrics",
        "/metrics/cluster",
    ):
        status, body = admin_get(http, path)
        assert status == 200, (path, body[:500])
        answers[path] = body
    # The operator does see the failures, masked.
    jobs = {
        j["job_id"]: j
        for j in http.request(
            "/v1/admin/jobs?limit=1000", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        ).json()["jobs"]
    }
    assert "X-Amz-Signature=***" in jobs[str(story.leaky_job)]["last_error"]
    for where, body in answers.items():
        assert leaked(body, story.secrets) == [], where


def test_no_log_line_holds_a_secret(story: Story) -> None:
    deployment = story.deployment
    # Let the processes flush what they wrote about the last failure.
    time.sleep(0.5)
    for proc in (deployment.worker, deployment.web, deployment.refused):
        log = proc.log()
        assert leaked(log, story.secrets) == [], proc.name
    # The worker did log the failures it hid the secrets from.
    worker_log = deployment.worker.log()
    assert f"job {story.leaky_job} failed (permanent)" in worker_log


def test_the_log_files_are_where_the_test_looked(story: Story) -> None:
    for proc in (story.deployment.worker, story.deployment.web):
        assert Path(proc.log_path).stat().st_size > 0
