"""A team's first deploy keeps the result backend of its Celery setup: ``result_backend``
in the deployment's settings module, or ``CELERY_RESULT_BACKEND`` in its environment (which
Celery reads before any setting). Its plain Celery tasks keep their results there, and a
lifecycle job still answers from the journal wherever its id is read: by
``celery.result.AsyncResult(id, app=app)`` in a process that holds only the id, as Celery's
documentation reads a result. Before the layer, the deployment's backend replaced the
journal as the app's: such a read waited for a state nothing stores there (PENDING for
good)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine

from tests.support.procs import ROOT, launching, ready, service_env
from tests.support.servers import RedisServer

pytestmark = pytest.mark.timeout(150)

TASKS = """from jobsapp.celery_app import app


@app.task(name="deploy.add")
def add(x, y):
    return x + y
"""
# What a process that holds only ids does: reads them through the app, as Celery's guide.
READER = """import json, sys
from celery import group
from celery.result import AsyncResult, GroupResult
from jobsapp.celery_app import app
from deploy_tasks import add
from tests.support.first_hour_tasks import add as job_add, shaky

job = shaky.delay(sys.argv[1], fail_times=1)
held = AsyncResult(job.id, app=app)
answer = {"job": held.get(timeout=40), "state": held.state, "retries": held.retries}
answer["read_again"] = AsyncResult(job.id, app=app).state  # no get(): the backend's meta
answer["plain"] = AsyncResult(add.apply_async((2, 3), ignore_result=False).id, app=app).get(
    timeout=40
)
answer["failed"] = type(AsyncResult(shaky.delay(sys.argv[1] + "-x", fail_times=9).id, app=app)
    .get(timeout=40, propagate=False)).__name__
jobs = group(job_add.s(1, 2), job_add.s(3, 4)).apply_async()
answer["job_group"] = GroupResult.restore(jobs.id, app=app).join_native(timeout=40)
plain = group(add.s(1, 1).set(ignore_result=False), add.s(2, 2).set(ignore_result=False))()
answer["plain_group"] = plain.join_native(timeout=40)
answer["results"] = app.backend.as_uri()
print(json.dumps(answer))
"""


@pytest.mark.parametrize(
    ("named_in", "store"),
    [("settings module", "redis"), ("environment", "redis"), ("settings module", "rpc")],
)
def test_a_deployments_result_backend_keeps_plain_results_and_jobs_answer_from_the_journal(
    named_in: str,
    store: str,
    pg: Engine,
    postgres_url: str,
    module_redis: RedisServer,
    tmp_path: Path,
) -> None:
    """``rpc://`` (results as messages back to the caller, common beside RabbitMQ) and
    Redis's (pub/sub and keys) are Celery's two kinds of backend: both stay whole."""
    del pg  # migrated
    (tmp_path / "deploy_tasks.py").write_text(TASKS)
    url = module_redis.url if store == "redis" else "rpc://"
    backend = {"CELERY_RESULT_BACKEND": url}
    if named_in == "settings module":
        (tmp_path / "deploy_settings.py").write_text(f"result_backend = {url!r}\n")
        backend = {"CELERY_CONFIG_MODULE": "deploy_settings"}
    env = service_env(
        database_url=postgres_url,
        broker_url=module_redis.url,
        var_dir=tmp_path / "var",
        settings={
            **backend,
            "PYTHONPATH": f"{ROOT}:{tmp_path}",
            "JOBSAPP_IMPORTS": "tests.support.tasks,tests.support.first_hour_tasks,deploy_tasks",
        },
    )
    with launching(env, tmp_path) as launcher:
        ready(launcher.worker(f"results-{uuid.uuid4().hex[:6]}"), timeout=60)
        read = subprocess.run(
            [sys.executable, "-c", READER, uuid.uuid4().hex],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert read.returncode == 0, read.stderr[-3000:]
    answer = json.loads(read.stdout.splitlines()[-1])
    token = read.args[-1]
    assert answer["job"] == f"{token} done"  # as Celery's backend answers a retried task
    assert (answer["state"], answer["retries"], answer["read_again"]) == ("SUCCESS", 1, "SUCCESS")
    assert answer["failed"] == "ConnectionError"
    assert answer["plain"] == 5
    assert answer["job_group"] == [3, 7]
    assert answer["plain_group"] == [2, 4]  # Celery's native join, on its Redis backend
    # What Celery's worker banner and ``celery report`` show: both stores, no password.
    assert answer["results"] == f"jobsapp+{url}"
