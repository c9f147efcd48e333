"""Process hygiene of a real ``celery -A jobsapp worker``: no green pool, no secret in a log.

A green pool (gevent, eventlet) runs the heartbeat as a greenlet that a CPU-bound job
starves, so the reaper would take a live run: the worker refuses to start on one, saying
why. And credentials in an exception's text or traceback never reach the worker's log,
neither through Celery's own "Task ... raised unexpected" line nor through a task's
``log.exception``: every handler the app configures scrubs them.
"""

from __future__ import annotations

import os
import re
import uuid

import pytest

from tests.chaos.harness import Cluster
from tests.chaos.messages import Sender
from tests.support.procs import BIN, WORKER_FLAGS, ready
from tests.support.tasks import planted_secrets

pytestmark = pytest.mark.timeout(120)

# Celery's gevent pool by its class, through Celery's "custom" pool: "-P gevent" makes
# Celery import gevent (not installed here) before jobsapp is even loaded.
GEVENT_POOL = {"CELERY_CUSTOM_WORKER_POOL": "celery.concurrency.gevent:TaskPool"}


def test_a_worker_on_a_green_pool_refuses_to_start(cluster: Cluster) -> None:
    flags = [f if f != "--pool=prefork" else "--pool=custom" for f in WORKER_FLAGS]
    argv = [str(BIN / "celery"), "-A", "jobsapp", "worker", *flags, "-n", "green@%h"]
    worker = cluster.launcher.start("green", argv, GEVENT_POOL)
    code = worker.wait(timeout=60)
    log = worker.log()
    assert code != 0, log[-3000:]
    assert "jobsapp does not run on a green pool (celery.concurrency.gevent.TaskPool)" in log
    assert "--pool=prefork" in log
    assert " ready." not in log


def test_no_secret_of_a_failing_task_reaches_the_worker_log(cluster: Cluster) -> None:
    env = {"JOBSAPP_IMPORTS": "tests.support.tasks,tests.support.log_leaks"}
    argv = [str(BIN / "celery"), "-A", "jobsapp", "worker", *WORKER_FLAGS, "-n", "leaks@%h"]
    worker = cluster.launcher.start("leaks", argv, env)
    ready(worker, timeout=45)
    token = uuid.uuid4().hex
    sender = Sender(cluster.broker.url, cluster.launcher.workdir)
    raised = sender.send_task("tests.raises_secrets", {"token": token})
    logged = sender.send_task("tests.logs_secrets", {"token": token})
    worker.wait_for_log(rf"Task tests.raises_secrets\[{raised}\] raised unexpected")
    worker.wait_for_log(rf"Task tests.logs_secrets\[{logged}\] succeeded")
    log = worker.log()
    secrets = planted_secrets(token)
    assert [k for k, v in secrets.items() if v in log] == []
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in log
    # Still readable: what failed, where, and the traceback's frames, with the values masked.
    assert "ConnectionError: AWS_SECRET_ACCESS_KEY=*** refused by https://svc:***@" in log
    assert "postgresql://app:***@db:5432/jobs" in log
    assert re.search(r"upstream failed; retried with token=\*\*\*\nTraceback", log)
    assert "in logs_secrets\n    raise _leaky_error(token)" in log
