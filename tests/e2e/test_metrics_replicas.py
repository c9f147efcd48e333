"""Two web replicas behind one Prometheus-style scrape: the journal's totals counted once.

Two gunicorn replicas (the Procfile's web line) on one database, a round-robin load
balancer in front of them, and the scrape configuration of docs/operators.md: job
``jobsapp-web`` scrapes ``/metrics`` on every replica, job ``jobsapp-cluster`` scrapes
``/metrics/cluster`` through the balancer. Summing every series of one scrape round, as
``sum()`` over a Prometheus does, gives the journal's numbers once, and the replicas'
own numbers once per replica. The journal is written by the journal's own transitions
and rolled up by the rollup pass, as beat does.
"""

from __future__ import annotations

import itertools
import os
import threading
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, create_engine, text

from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.rules.states import Outcome
from jobsapp.monitor import rollup
from tests.support import tasks
from tests.support.databases import migrated_postgres
from tests.support.env import SESSION
from tests.support.journal_view import per_job
from tests.support.webserver import fetch, running_web

SCRAPER = f"scraper-{uuid.uuid4().hex}"
AUTH = {"Authorization": f"Bearer {SCRAPER}"}

pytestmark = pytest.mark.timeout(180)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def scrape(job: str, url: str) -> tuple[list[Sample], str]:
    """One target's samples, labelled with ``job`` and ``instance`` as Prometheus does;
    and which replica answered (the balancer says so)."""
    reply = fetch(urllib.request.Request(url, headers=AUTH))  # noqa: S310 - http, local
    assert reply.status == 200, reply.body[:500]
    target = {"job": job, "instance": urlsplit(url).netloc}
    samples = [
        Sample(s.name, {**s.labels, **target}, s.value)
        for family in text_string_to_metric_families(reply.body.decode())
        for s in family.samples
    ]
    return samples, reply.headers.get("X-Replica", urlsplit(url).netloc)


def total(samples: Sequence[Sample], name: str, **match: str) -> float:
    """``sum(name{match})``."""
    return sum(s.value for s in samples if s.name == name and match.items() <= s.labels.items())


@contextmanager
def balancer(replicas: Sequence[str]) -> Iterator[str]:
    """A round-robin HTTP proxy in front of ``replicas``: one address, either answers."""
    turn = itertools.cycle(replicas)

    class Forward(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            replica = next(turn)
            headers = {k: v for k, v in self.headers.items() if k == "Authorization"}
            reply = fetch(urllib.request.Request(replica + self.path, headers=headers))  # noqa: S310
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.headers.get("Content-Type", "text/plain"))
            self.send_header("Content-Length", str(len(reply.body)))
            self.send_header("X-Replica", urlsplit(replica).netloc)
            self.end_headers()
            self.wfile.write(reply.body)

        def log_message(self, *_args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with migrated_postgres(f"jobsapp_e2e_replicas_{SESSION}") as url:
        yield url


@pytest.fixture(scope="module")
def db(database: str) -> Iterator[Engine]:
    engine = create_engine(database)
    try:
        yield engine
    finally:
        engine.dispose()


def run_jobs(db: Engine, *, succeed: int, fail: int, waiting: int) -> None:
    """Jobs moved through the journal's own transitions, as workers would; then rolled up."""
    spec = registry.JOBS
    for n in range(succeed + fail + waiting):
        job = tasks.echo.new_job((f"replicas-{n}",), {}, None)
        with db.begin() as conn:
            journal.enqueue(conn, job, now=utcnow(), actor="producer")
        if n >= succeed + fail:
            continue
        with db.begin() as conn:
            claimed = journal.claim(conn, spec, job.job_id, 1, worker="w@h:1")
            assert claimed is not None
            token = claimed.claimed_token
            if n < succeed:
                assert journal.succeed(conn, spec, job.job_id, 1, token=token, actor="w@h:1")
            else:
                assert journal.fail(
                    conn,
                    spec,
                    job.job_id,
                    1,
                    token=token,
                    error="no",
                    outcome=Outcome.PERMANENT,
                    actor="w@h:1",
                )
    while rollup.run_once(db, settle=timedelta(0)):
        pass


def test_two_replicas_behind_one_scrape_count_the_journal_once(
    database: str, db: Engine, tmp_path: Path
) -> None:
    run_jobs(db, succeed=3, fail=1, waiting=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSAPP_")}
    env |= {
        "JOBSAPP_DATABASE_URL": database,
        "JOBSAPP_BROKER_URL": "memory://",
        "JOBSAPP_STORAGE_URL": f"file://{tmp_path / 'objects'}",
        "JOBSAPP_VAR_DIR": str(tmp_path / "var"),
        "JOBSAPP_IMPORTS": "tests.support.tasks",
        "JOBSAPP_METRICS_TOKEN": SCRAPER,
    }
    with ExitStack() as stack:
        replicas = [
            stack.enter_context(running_web(env, tmp_path / f"web-{n}.log", gunicorn=True))
            for n in range(2)
        ]
        urls = [r.base_url for r in replicas]
        lb = stack.enter_context(balancer(urls))
        rounds: list[tuple[list[Sample], list[Sample], str]] = []
        for _ in range(2):  # two scrape intervals: the balancer hands each to a replica
            own = [s for url in urls for s in scrape("jobsapp-web", f"{url}/metrics")[0]]
            cluster, answered = scrape("jobsapp-cluster", f"{lb}/metrics/cluster")
            rounds.append((own, cluster, answered))
        # What the documented rules guard against: the cluster endpoint scraped per replica.
        per_replica = [s for url in urls for s in scrape("mistake", f"{url}/metrics/cluster")[0]]

    states = counted(db, "job_runs", "state")
    ended = {t: sum(per_job(db, t).values()) for t in ("succeed", "fail")}
    assert {answered for _, _, answered in rounds} == {urlsplit(u).netloc for u in urls}
    assert _same_values(rounds[0][1], rounds[1][1])
    for own, cluster, _ in rounds:
        everything = own + cluster
        assert total(everything, "jobsapp_attempts_total", outcome="succeeded") == ended["succeed"]
        assert total(everything, "jobsapp_attempts_total", outcome="failed") == ended["fail"] == 1
        assert total(everything, "jobsapp_run_duration_seconds_count") == 4
        for state in ("queued", "succeeded", "failed"):
            assert total(everything, "jobsapp_jobs", state=state) == states[state]
        # A replica's own numbers add up over the replicas: here, how many there are.
        assert total(everything, "jobsapp_web_info") == 2
        assert total(own, "jobsapp_jobs") == 0
    doubled = total(per_replica, "jobsapp_attempts_total", outcome="succeeded")
    assert doubled == 2 * ended["succeed"]
    # The recording rule's max without(instance) counts it once even then.
    assert _max_without_instance(per_replica, "jobsapp_attempts_total", "succeeded") == 3


def counted(db: Engine, table: str, column: str) -> dict[str, int]:
    with db.connect() as conn:
        rows = conn.execute(text(f"SELECT {column}, count(*) FROM {table} GROUP BY {column}"))
        return {str(key): int(n) for key, n in rows}


def _same_values(a: Sequence[Sample], b: Sequence[Sample]) -> bool:
    # Every series but the lag gauges (they age between two scrapes) is equal.
    def values(samples: Sequence[Sample]) -> dict[tuple[str, str], float]:
        return {
            (s.name, str(sorted((k, v) for k, v in s.labels.items() if k != "instance"))): s.value
            for s in samples
            if "seconds" not in s.name
        }

    return values(a) == values(b)


def _max_without_instance(samples: Sequence[Sample], name: str, outcome: str) -> float:
    groups: dict[str, float] = {}
    for s in samples:
        if s.name == name and s.labels.get("outcome") == outcome:
            key = str(sorted((k, v) for k, v in s.labels.items() if k != "instance"))
            groups[key] = max(groups.get(key, 0.0), s.value)
    return sum(groups.values())
