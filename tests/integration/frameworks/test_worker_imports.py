"""A real ``celery -A jobsapp worker`` finds the examples' tasks through JOBSAPP_IMPORTS.

Workers are subprocesses on this session's queue, with only the environment the docs
(docs/integrations.md) tell a user to set; the jobs come from the Django view and the
Flask form of the examples.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from jobsapp.celery_app import app
from jobsapp.maintenance import relay
from jobsapp.settings import get_settings
from tests.support.env import service
from tests.support.journal_view import run_row
from tests.support.procs import BIN, WORKER_FLAGS, Launcher, Proc, launching, ready, service_env
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(120)

DJANGO_TASKS = "examples.django_app.shop.tasks"
FLASK_TASKS = "examples.flask_app.tasks"
UNCLAIMED_AFTER = 1.0


@pytest.fixture
def launcher(
    django_db: str, db: Engine, redis_clean: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Launcher]:
    # The producer (this process) marks each message's check time from this setting.
    monkeypatch.setenv("JOBSAPP_UNCLAIMED_AFTER", str(UNCLAIMED_AFTER))
    get_settings.cache_clear()
    env = service_env(
        database_url=django_db,
        broker_url=service("JOBSAPP_TEST_REDIS_URL"),
        var_dir=tmp_path / "var",
        settings={"DJANGO_SETTINGS_MODULE": "examples.django_app.settings"},
    )
    with launching(env, tmp_path) as launched:
        yield launched
    get_settings.cache_clear()


def start_worker(launcher: Launcher, imports: str) -> Proc:
    name = f"examples-{uuid.uuid4().hex[:6]}@%h"
    argv = [
        str(BIN / "celery"),
        "-A",
        "jobsapp",
        "worker",
        *WORKER_FLAGS,
        "-Q",
        app.conf.task_default_queue,
        "-n",
        name,
    ]
    worker = launcher.start("worker", argv, {"JOBSAPP_IMPORTS": imports})
    ready(worker, timeout=60)
    return worker


def state(db: Engine, job_id: str) -> str:
    return str(run_row(db, uuid.UUID(job_id))["state"])


def place_order_and_upload() -> tuple[dict[str, Any], dict[str, Any]]:
    from django.test import Client

    from examples.flask_app.app import create_app

    order = Client().post("/orders/", {"customer": "ada", "total_cents": "250"}).json()
    upload = (
        create_app()
        .test_client()
        .post(
            "/uploads/session",
            data={"file": (io.BytesIO(b"bytes"), "a.txt")},
            content_type="multipart/form-data",
        )
        .get_json()
    )
    return order, upload


def test_worker_runs_the_django_and_flask_examples_jobs(db: Engine, launcher: Launcher) -> None:
    start_worker(launcher, f"{DJANGO_TASKS},{FLASK_TASKS}")
    order, upload = place_order_and_upload()
    eventually(
        lambda: state(db, order["job_id"]) == state(db, upload["job_id"]) == "succeeded", timeout=60
    )


def test_a_module_missing_from_imports_leaves_its_job_queued_until_a_worker_has_it(
    db: Engine, launcher: Launcher
) -> None:
    partial = start_worker(launcher, DJANGO_TASKS)
    order, upload = place_order_and_upload()
    eventually(lambda: state(db, order["job_id"]) == "succeeded", timeout=60)
    partial.wait_for_log("unregistered task 'uploads.measure'")
    assert state(db, upload["job_id"]) == "queued"

    partial.kill()
    start_worker(launcher, f"{DJANGO_TASKS},{FLASK_TASKS}")
    cfg = relay.RelayConfig(unclaimed_after=timedelta(seconds=UNCLAIMED_AFTER))

    def relayed_and_done() -> bool:
        relay.run_once(app, db, cfg)  # what beat does every JOBSAPP_RELAY_EVERY
        return state(db, upload["job_id"]) == "succeeded"

    eventually(relayed_and_done, timeout=60, interval=0.5)
