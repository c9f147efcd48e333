"""What the end-to-end console tests share: a deployment's environment on a fresh database
(web and worker processes started from it), jobs enqueued into it, the operator's audit
trail, and the console driven in a browser."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from playwright.sync_api import Page
from sqlalchemy import Engine, create_engine, text

from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.transport import outbox
from tests.support.databases import fresh_postgres, migrate
from tests.support.env import service
from tests.support.servers import RedisServer

TOKEN = f"e2e-admin-{uuid.uuid4().hex}"


# What tests.fails_once raises on its first attempt.
REFUSAL = "upstream refuses this job until someone fixes it"


@contextmanager
def operator_env(
    tmp_path_factory: pytest.TempPathFactory, database: str, redis: RedisServer
) -> Iterator[dict[str, str]]:
    """The environment of a web app and worker on a fresh database and a Redis of their own."""
    base = service("JOBSAPP_TEST_DATABASE_URL")
    db_url = fresh_postgres(base, database)
    migrate(db_url)
    redis_url = redis.url
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}
    yield env | {
        "JOBSAPP_VAR_DIR": str(tmp_path_factory.mktemp(f"{database}-var")),
        "JOBSAPP_DATABASE_URL": db_url,
        "JOBSAPP_BROKER_URL": redis_url,
        "JOBSAPP_STORAGE_URL": f"file://{tmp_path_factory.mktemp(f'{database}-objects')}",
        "JOBSAPP_REDIS_URL": redis_url,
        "JOBSAPP_TEST_REDIS_URL": redis_url,
        "JOBSAPP_IMPORTS": "tests.support.tasks",
        "JOBSAPP_ADMIN_TOKEN": TOKEN,
    }
    admin = create_engine(base.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
    admin.dispose()


def enqueue(db: Engine, task: Any, *args: Any, publish: Celery | None = None) -> uuid.UUID:
    """A producer's enqueue into this module's journal; published only to ``publish``
    (no beat runs here, so an unpublished job stays queued)."""
    job = task.new_job(args, {}, None)
    with db.begin() as conn:
        result = journal.enqueue(conn, job, now=utcnow(), actor="producer")
    if publish is not None:
        assert result.message is not None
        assert outbox.publish(publish, [result.message]).accepted, "the broker refused it"
    return uuid.UUID(str(job.job_id))


def operator_events(db: Engine, job_id: uuid.UUID) -> list[tuple[str, str, str | None]]:
    with db.connect() as conn:
        found = conn.execute(
            text(
                "SELECT transition, actor, reason FROM job_events "
                "WHERE job_id = :j AND actor LIKE 'operator:%' ORDER BY id"
            ),
            {"j": job_id},
        )
        return [(r.transition, r.actor, r.reason) for r in found]


SCREENSHOTS = os.environ.get("JOBSAPP_SCREENSHOTS")


def log_in_page(page: Page, name: str = "alice", token: str = TOKEN) -> None:
    page.goto("/admin")
    assert "/admin/login" in page.url
    page.fill("input[name=token]", token)
    page.fill("input[name=name]", name)
    page.click("button:has-text('Log in')")


def state_of(db: Engine, job_id: uuid.UUID) -> str | None:
    with db.connect() as conn:
        found = conn.execute(text("SELECT state FROM job_runs WHERE job_id = :j"), {"j": job_id})
        return found.scalar()


def wait_state(db: Engine, job_id: uuid.UUID, state: str, worker_log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if state_of(db, job_id) == state:
            return
        time.sleep(0.2)
    tail = worker_log.read_text()[-3000:]
    raise AssertionError(f"{job_id} never {state} ({state_of(db, job_id)}); worker: {tail}")


@contextmanager
def deployment_engine(env: dict[str, str]) -> Iterator[Engine]:
    """An engine on the deployment's own database, disposed afterwards."""
    engine = create_engine(env["JOBSAPP_DATABASE_URL"])
    try:
        yield engine
    finally:
        engine.dispose()
