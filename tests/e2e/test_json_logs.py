"""JOBSAPP_LOG_FORMAT=json on a real worker, beat and gunicorn web: every line JSON, ids,
the body's traceback, no secrets, no terminal escapes.

A producer enqueues a job with a traceparent whose body fails once with a database URL
(password included) in its error; the worker's record of the retry carries the job's
ids and trace id and the body's own exception and traceback (``exc_type``,
``exc_message``, ``exc_info``), and the password appears nowhere in any process's log.
Every line of every process, Celery's banners and gunicorn's error and access logs
included, is one JSON object. In text format the same record carries the traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from tests.support.procs import ROOT, Launcher, Proc, launching, ready, service_env
from tests.support.servers import RedisServer
from tests.support.waiting import eventually
from tests.support.webserver import API_TOKEN, free_port

SECRET = "pl4nted-Passw0rd"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"

pytestmark = pytest.mark.timeout(180)

ENQUEUE = f"""
import sys
from tests.support import tasks
handle = tasks.flaky.apply_async(kwargs=dict(token=sys.argv[1], fail_times=1, secret={SECRET!r}),
                                 headers={{"traceparent": {TRACEPARENT!r}}})
print(handle.job_id)
"""


# The Procfile's web line.
GUNICORN = (
    sys.executable,
    "-m",
    "gunicorn",
    "-c",
    "python:jobsapp.web.gunicorn_conf",
    "--workers",
    "2",
    "--access-logfile",
    "-",
)
APP = "jobsapp.web.app:create_app()"


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of a log, each of which must be one JSON object."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def enqueue_flaky(env: dict[str, str]) -> str:
    token = f"json-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-c", ENQUEUE, token]
    produced = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return produced.stdout.strip().splitlines()[-1]


def start_gunicorn(launcher: Launcher) -> tuple[Proc, int]:
    port = free_port()
    argv = [*GUNICORN, "--bind", f"127.0.0.1:{port}", APP]
    return launcher.start("json-web", argv, {"JOBSAPP_API_TOKEN": API_TOKEN}), port


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):  # noqa: S310 - a local test server
            return True
    except OSError:
        return False


def test_worker_beat_and_web_write_scrubbed_json_lines_with_job_and_trace_ids(
    pg: Engine, postgres_url: str, module_redis: RedisServer, tmp_path: Path
) -> None:
    broker = module_redis.url
    env = service_env(
        database_url=postgres_url,
        broker_url=broker,
        var_dir=tmp_path / "var",
        settings={"JOBSAPP_LOG_FORMAT": "json"},
    )
    with launching(env, tmp_path) as launcher:
        worker, beat = launcher.worker("json"), launcher.beat("json-beat")
        web, port = start_gunicorn(launcher)
        ready(worker)
        job_id = enqueue_flaky(env)

        def retry_record() -> dict[str, Any] | None:
            records = json_lines(worker.log())
            mine = [r for r in records if r.get("job_id") == job_id and "retry" in r["message"]]
            return mine[0] if mine else None

        record = eventually(retry_record, timeout=60)
        eventually(
            lambda: any(
                r["logger"].startswith("jobsapp.maintenance") for r in json_lines(beat.log())
            ),
            timeout=60,
        )
        eventually(lambda: _answers(f"http://127.0.0.1:{port}/healthz"), timeout=30)
        eventually(
            lambda: any(
                r["logger"] == "gunicorn.access" and "/healthz" in r["message"]
                for r in json_lines(web.log())
            ),
            timeout=30,
        )
        eventually(
            lambda: any(
                r["logger"] == "jobsapp.maintenance.scheduler" for r in json_lines(beat.log())
            ),
            timeout=30,
        )
    assert (record["attempt"], record["module"], record["task"]) == (1, "jobs", "tests.flaky")
    assert record["trace_id"] == TRACE_ID
    assert record["level"] == "WARNING"
    # The body's exception, not the wrapper's: its type, its message, its own frame.
    assert record["exc_type"] == "builtins.ConnectionError"
    assert record["exc_message"] == "upstream down at postgresql://app:***@db.internal/jobs"
    assert 'tests/support/tasks.py", line' in record["exc_info"]
    assert "in flaky" in record["exc_info"]
    loggers = {
        proc.name: {r["logger"] for r in json_lines(proc.log())} for proc in (worker, beat, web)
    }
    assert {"gunicorn.error", "gunicorn.access"} <= loggers["json-web"]
    assert "celery.apps.worker" in loggers["json"]  # its banner, and "ready"
    for proc in (worker, beat, web):
        assert SECRET not in proc.log()
        assert "\x1b" not in proc.log()
        assert json_lines(proc.log()), proc.log()[-2000:]


def test_a_failed_attempt_logs_the_bodys_traceback_in_text_too(
    pg: Engine, postgres_url: str, module_redis: RedisServer, tmp_path: Path
) -> None:
    env = service_env(
        database_url=postgres_url,
        broker_url=module_redis.url,
        var_dir=tmp_path / "var",
        settings={},
    )
    with launching(env, tmp_path) as launcher:
        worker = launcher.worker("text")
        ready(worker)
        job_id = enqueue_flaky(env)
        found = worker.wait_for_log(
            rf"job {job_id} attempt 1: retry in [^\n]*\nTraceback \(most recent call last\):"
            r"(?:\n .*)+\nConnectionError: upstream down at postgresql://app:\*\*\*@",
            timeout=60,
        )
    assert 'tests/support/tasks.py", line' in found.group(0)
    assert SECRET not in worker.log()
