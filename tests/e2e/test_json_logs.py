"""JOBSAPP_LOG_FORMAT=json on a real worker, beat and web: JSON lines, ids, no secrets.

A producer enqueues a job with a traceparent whose body fails once with a database URL
(password included) in its error; the worker's record of the retry carries the job's
ids and trace id, and the password appears nowhere in any process's log.
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

from tests.e2e.procs import ROOT, launching, ready, service_env
from tests.e2e.webserver import WEB, free_port
from tests.support.env import redis_url
from tests.support.waiting import eventually

BROKER_DB = 6
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


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):  # noqa: S310 - a local test server
            return True
    except OSError:
        return False


def test_worker_beat_and_web_write_scrubbed_json_lines_with_job_and_trace_ids(
    pg: Engine, postgres_url: str, tmp_path: Path
) -> None:
    broker = redis_url(BROKER_DB)
    env = service_env(database_url=postgres_url, broker_url=broker, var_dir=tmp_path / "var",
                      settings={"JOBSAPP_LOG_FORMAT": "json"})  # fmt: skip
    with launching(env, tmp_path) as launcher:
        worker, beat = launcher.worker("json"), launcher.beat("json-beat")
        port = free_port()
        web = launcher.start("json-web", [*WEB, "--port", str(port)])
        ready(worker)
        token = f"json-{uuid.uuid4().hex[:8]}"
        argv = [sys.executable, "-c", ENQUEUE, token]
        produced = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=60, check=True)  # fmt: skip
        job_id = produced.stdout.strip().splitlines()[-1]

        def retry_record() -> dict[str, Any] | None:
            records = json_lines(worker.log())
            mine = [r for r in records if r.get("job_id") == job_id and "retry" in r["message"]]
            return mine[0] if mine else None

        record = eventually(retry_record, timeout=60)
        eventually(lambda: any(r["logger"].startswith("jobsapp.maintenance")
                               for r in json_lines(beat.log())), timeout=60)  # fmt: skip
        eventually(lambda: _answers(f"http://127.0.0.1:{port}/healthz"), timeout=30)
        eventually(lambda: any(r["logger"] == "werkzeug" and "/healthz" in r["message"]
                               for r in json_lines(web.log())), timeout=30)  # fmt: skip
    assert (record["attempt"], record["module"], record["task"]) == (1, "jobs", "tests.flaky")
    assert record["trace_id"] == TRACE_ID
    assert record["level"] == "WARNING"
    for proc in (worker, beat, web):
        assert SECRET not in proc.log()
        logged = [line for line in proc.log().splitlines() if line.startswith("{")]
        assert logged, proc.log()[-2000:]
