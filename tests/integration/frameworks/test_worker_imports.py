"""A real ``celery -A jobsapp worker`` finds the examples' tasks through JOBSAPP_IMPORTS.

The worker is a subprocess on this session's queue, with only the environment the
docs (docs/integrations.md) tell a user to set; the jobs come from the Django view and
the Flask form of the examples.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from jobsapp.celery_app import app
from tests.e2e.procs import BIN, WORKER_FLAGS, Launcher, Proc, ready, service_env
from tests.support.env import service
from tests.support.journal_view import run_row
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(120)

IMPORTS = "examples.django_app.shop.tasks,examples.flask_app.tasks"


@pytest.fixture
def real_worker(
    django_db: str, db: Engine, redis_clean: None, tmp_path: Path
) -> Iterator[Proc]:
    env = service_env(
        database_url=django_db, broker_url=service("JOBSAPP_TEST_REDIS_URL"),
        var_dir=tmp_path / "var",
        settings={"JOBSAPP_IMPORTS": IMPORTS,
                  "DJANGO_SETTINGS_MODULE": "examples.django_app.settings"},
    )  # fmt: skip
    launcher = Launcher(env, tmp_path)
    name = f"examples-{uuid.uuid4().hex[:6]}@%h"
    argv = [str(BIN / "celery"), "-A", "jobsapp", "worker", *WORKER_FLAGS,
            "-Q", app.conf.task_default_queue, "-n", name]  # fmt: skip
    try:
        worker = launcher.start("worker", argv)
        ready(worker, timeout=60)
        yield worker
    finally:
        launcher.kill_all()
        launcher.dump_logs()


def succeeded(db: Engine, job_id: str) -> bool:
    return bool(run_row(db, uuid.UUID(job_id))["state"] == "succeeded")


def test_worker_runs_the_django_and_flask_examples_jobs(db: Engine, real_worker: Proc) -> None:
    from django.test import Client

    from examples.flask_app.app import create_app

    order = Client().post("/orders/", {"customer": "ada", "total_cents": "250"}).json()
    upload = create_app().test_client().post(
        "/uploads/session", data={"file": (io.BytesIO(b"bytes"), "a.txt")},
        content_type="multipart/form-data",
    ).get_json()  # fmt: skip
    eventually(lambda: succeeded(db, order["job_id"]) and succeeded(db, upload["job_id"]),
               timeout=60)  # fmt: skip
    assert real_worker.alive(), real_worker.log()
