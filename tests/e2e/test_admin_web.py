"""The operator's side of `jobsapp web` as real processes: the token, the JSON summary, a
replay that a Celery worker then finishes, cancel, the admin pages read with the bearer
token, and /metrics. The browser's side (login, forms, CSRF) is test_admin_ui.py.

Its own Postgres database and Redis database, so no other suite's worker or cleanup can
take its messages or empty its tables.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from jsonschema import Draft202012Validator
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, create_engine, text

from tests.support import tasks
from tests.support.console_e2e import REFUSAL, TOKEN, enqueue, operator_env, operator_events
from tests.support.env import SESSION
from tests.support.planted import rolled_up
from tests.support.servers import RedisServer
from tests.support.webserver import Http, Reply, running_web, running_worker

DATABASE = f"jobsapp_e2e_admin_{SESSION}"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ERROR = {"error", "reason"}
# No row has it. Fixed, not drawn, because it shows in test ids, which every xdist worker
# must collect alike.
UNKNOWN_ID = uuid.UUID("00000000-0000-4000-8000-00000000dead")
METRICS = (
    "jobsapp_jobs",
    "jobsapp_oldest_queued_seconds",
    "jobsapp_stale_running",
    "jobsapp_outbox_backlog",
    "jobsapp_outbox_lag_seconds",
)


pytestmark = pytest.mark.timeout(120)


# --------------------------------------------------------------------------- services


@pytest.fixture(scope="module")
def admin_env(
    tmp_path_factory: pytest.TempPathFactory, module_redis: RedisServer
) -> Iterator[dict[str, str]]:
    with operator_env(tmp_path_factory, DATABASE, module_redis) as env:
        yield env


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-admin-logs")


@pytest.fixture(scope="module")
def http(admin_env: dict[str, str], logs: Path) -> Iterator[Http]:
    with running_web(admin_env, logs / "web.log") as client:
        yield client


@pytest.fixture(scope="module")
def worker(admin_env: dict[str, str], logs: Path) -> Iterator[Path]:
    with running_worker(admin_env, logs / "worker.log") as log:
        yield log


@pytest.fixture(scope="module")
def db(admin_env: dict[str, str]) -> Iterator[Engine]:
    engine = create_engine(admin_env["JOBSAPP_DATABASE_URL"])
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def broker(admin_env: dict[str, str]) -> Celery:
    """The producer's side of this module's broker."""
    return Celery("e2e-admin-producer", broker=admin_env["JOBSAPP_BROKER_URL"])


# ----------------------------------------------------------------------------- helpers


def post_json(http: Http, path: str, body: object, headers: dict[str, str] = AUTH) -> Reply:
    data = json.dumps(body).encode()
    return http.request(path, data, {**headers, "Content-Type": "application/json"}, "POST")


def get(http: Http, path: str, headers: dict[str, str] = AUTH) -> Reply:
    return http.request(path, headers=headers)


def action(module: str, job_id: uuid.UUID, verb: str) -> str:
    return f"/v1/admin/jobs/{module}/{job_id}/{verb}"


def listed(http: Http, job_id: uuid.UUID, query: str = "") -> dict[str, Any] | None:
    reply = get(http, f"/v1/admin/jobs?module=jobs{query}")
    assert reply.status == 200, reply.body
    return next((j for j in reply.json()["jobs"] if j["job_id"] == str(job_id)), None)


def wait_listed(http: Http, job_id: uuid.UUID, state: str, worker_log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = listed(http, job_id)
        if row is not None and row["state"] == state:
            return row
        time.sleep(0.2)
    raise AssertionError(f"{job_id} never {state}: {row}; worker: {worker_log.read_text()[-3000:]}")


def assert_documented(http: Http, schema: str, instance: object) -> None:
    components = http.get("/openapi.json").json()["components"]
    root = {"$ref": f"#/components/schemas/{schema}", "components": components}
    Draft202012Validator(root).validate(instance)


# ------------------------------------------------------------------------------ tests


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/admin/jobs"),
        ("POST", action("jobs", uuid.UUID(int=1), "replay")),
        ("POST", action("jobs", uuid.UUID(int=1), "cancel")),
    ],
)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": "Bearer"},
    ],
    ids=["none", "wrong", "basic", "empty"],
)
def test_the_operator_api_needs_the_bearer_token(
    http: Http, method: str, path: str, headers: dict[str, str]
) -> None:
    # A guesser of its own: no token of the client's, and an address whose failures
    # (throttled past five) never hold the operator's requests of the other tests.
    guesser = Http(http.base_url, source="127.0.0.2")
    body = json.dumps({"reason": "x"}).encode() if method == "POST" else None
    reply = guesser.request(path, body, {**headers, "Content-Type": "application/json"}, method)

    assert reply.status == 401
    assert reply.headers["Content-Type"] == "application/json"
    assert set(reply.json()) == ERROR
    assert reply.headers["WWW-Authenticate"].startswith("Bearer")


def test_without_a_configured_token_the_operator_api_is_disabled(
    admin_env: dict[str, str], logs: Path
) -> None:
    env = {k: v for k, v in admin_env.items() if k != "JOBSAPP_ADMIN_TOKEN"}
    with running_web(env, logs / "web-no-token.log") as http:
        jobs, page = get(http, "/v1/admin/jobs"), get(http, "/admin")
        scrape = http.get("/metrics/cluster")

    assert jobs.status == 403
    assert "operator API disabled" in jobs.json()["reason"]
    assert page.status == 403
    assert "operator UI is disabled" in page.body.decode()
    assert scrape.status == 200


def test_a_failed_job_is_replayed_through_the_api_and_finished_by_a_worker(
    http: Http, worker: Path, db: Engine, broker: Celery
) -> None:
    job_id = enqueue(db, tasks.fails_once, f"api-{uuid.uuid4()}", publish=broker)
    failed = wait_listed(http, job_id, "failed", worker)
    assert (failed["outcome"], failed["attempts"], failed["max_attempts"]) == ("permanent", 1, 1)
    assert failed["last_error"] == f"[permanent] PermanentError: {REFUSAL}"
    assert failed["task_name"] == "tests.fails_once"
    rolled_up(db)  # what beat's next rollup tick counts
    summary = get(http, "/v1/admin/jobs?state=failed").json()
    assert_documented(http, "JobSummary", summary)
    assert summary["counts"]["jobs"]["failed"] >= 1
    assert set(summary["counts"]) == {"jobs", "attachments", "reprocess"}

    reply = post_json(
        http, action("jobs", job_id, "replay"), {"reason": "upstream fixed", "actor": "alice"}
    )

    assert reply.status == 200, reply.body
    assert reply.json() == {
        "module": "jobs",
        "job_id": str(job_id),
        "state": "queued",
        "attempt": 2,
        "published": True,
        "waiting": False,
    }
    assert_documented(http, "Replayed", reply.json())
    done = wait_listed(http, job_id, "succeeded", worker)
    assert done["attempts"] == 2
    assert operator_events(db, job_id) == [("replay", "operator:alice", "upstream fixed")]
    again = post_json(http, action("jobs", job_id, "replay"), {"reason": "once more"})
    assert (again.status, again.json()["error"]) == (409, "not_failed")


def test_cancel_through_the_api(http: Http, db: Engine) -> None:
    job_id = enqueue(db, tasks.echo, "never-published")

    reply = post_json(http, action("jobs", job_id, "cancel"), {"reason": "not wanted"})

    assert reply.status == 200, reply.body
    assert_documented(http, "Cancelled", reply.json())
    row = listed(http, job_id, "&state=cancelled")
    assert row is not None
    assert (row["outcome"], row["last_error"]) == ("cancelled", "not wanted")
    assert operator_events(db, job_id) == [("cancel", "operator:api", "not wanted")]
    again = post_json(http, action("jobs", job_id, "cancel"), {"reason": "again"})
    assert (again.status, again.json()["error"]) == (409, "not_active")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (None, "bad_request"),
        ({}, "bad_request"),
        ({"reason": ""}, "bad_request"),
        ({"reason": "x" * 501}, "bad_request"),
        ({"reason": 42}, "bad_request"),
        ({"reason": "ok", "actor": "a\nb"}, "bad_request"),
        ({"reason": "ok", "job_id": "other"}, "bad_request"),
        # A JSON string holding an object is still a string.
        ('{"reason": "ok"}', "bad_request"),
    ],
)
def test_an_action_without_a_usable_reason_is_a_400(
    http: Http, db: Engine, body: object, code: str
) -> None:
    job_id = enqueue(db, tasks.echo, "untouched")
    data = b"reason=plain-form" if body is None else json.dumps(body).encode()

    reply = http.request(
        action("jobs", job_id, "cancel"), data, {**AUTH, "Content-Type": "application/json"}, "POST"
    )

    assert (reply.status, reply.json()["error"]) == (400, code)
    assert listed(http, job_id, "&state=queued") is not None


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        (action("jobs", UNKNOWN_ID, "replay"), 404, "unknown_job"),
        (action("nope", UNKNOWN_ID, "cancel"), 404, "unknown_module"),
        ("/v1/admin/jobs/jobs/not-a-uuid/replay", 404, "not_found"),
    ],
)
def test_unknown_jobs_are_json_404s(http: Http, path: str, status: int, code: str) -> None:
    reply = post_json(http, path, {"reason": "why not"})

    assert (reply.status, reply.json()["error"]) == (status, code)


@pytest.mark.parametrize(
    "query", ["?state=done", "?module=nope", "?limit=0", "?limit=abc", "?limit=5000"]
)
def test_summary_filters_it_cannot_answer_are_400s(http: Http, query: str) -> None:
    reply = get(http, "/v1/admin/jobs" + query)

    assert (reply.status, reply.json()["error"]) == (400, "bad_filter")


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("?state=done", "state must be one of"),
        ("?module=nope", "no run table is registered"),
        ("?min_age=soon", "an age is a number"),
        ("?min_age=%C2%B2h", "an age is a number"),
        ("?max_age=" + "9" * 5000, "an age is a number"),
        ("?after=page-2", "cursor is malformed"),
        ("?attachment=42", "attachment must be"),
        ("?q=" + "x" * 201, "limited to 200 characters"),
    ],
)
def test_the_jobs_page_explains_a_bad_filter(http: Http, query: str, says: str) -> None:
    reply = get(http, "/admin/jobs" + query)

    assert reply.status == 400
    assert reply.headers["Content-Type"].startswith("text/html")
    assert says in reply.body.decode()


def test_metrics_are_read_from_the_journal_at_scrape_time(http: Http, db: Engine) -> None:
    enqueue(db, tasks.echo, "waiting-for-the-relay")
    rolled_up(db)  # finished runs count once beat's rollup saw them

    reply = http.get("/metrics/cluster")

    assert reply.status == 200
    assert reply.headers["Content-Type"].startswith("text/plain; version=")
    families = {f.name: f for f in text_string_to_metric_families(reply.body.decode())}
    assert set(METRICS) <= set(families)
    jobs = {
        (s.labels["module"], s.labels["task"], s.labels["queue"], s.labels["state"]): s.value
        for s in families["jobsapp_jobs"].samples
    }
    with db.connect() as conn:
        rows = conn.execute(
            text("SELECT task_name, state, count(*) FROM job_runs GROUP BY task_name, state")
        )
        in_db = {("jobs", task, "celery", state): float(n) for task, state, n in rows}
    assert {k: v for k, v in jobs.items() if k[0] == "jobs" and v} == in_db
    # A registered task nothing ran yet has its series, at zero.
    assert jobs[("attachments", "jobsapp.attachments.process", "celery", "running")] == 0
    backlog = families["jobsapp_outbox_backlog"].samples[0].value
    assert backlog >= 1
    assert families["jobsapp_outbox_lag_seconds"].samples[0].value >= 0
    oldest = {
        (s.labels["module"], s.labels["task"]): s.value
        for s in families["jobsapp_oldest_queued_seconds"].samples
    }
    assert oldest[("jobs", "tests.echo")] >= 0
    assert {s.labels["module"] for s in families["jobsapp_stale_running"].samples} == {
        "jobs",
        "attachments",
        "reprocess",
    }


def test_the_admin_pages_show_jobs_with_everything_escaped(http: Http, db: Engine) -> None:
    job_id = enqueue(db, tasks.echo, "shown-on-the-page")
    hostile = '<script>alert("owned")</script> & <b>bold</b>'
    assert post_json(http, action("jobs", job_id, "cancel"), {"reason": hostile}).status == 200

    listing = get(http, f"/admin/jobs?q={job_id}")
    one = get(http, f"/admin/jobs/jobs/{job_id}")
    overview = get(http, "/admin")

    escaped = "&lt;script&gt;alert(&#34;owned&#34;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;"
    for reply in (listing, one, overview):
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/html")
        assert "default-src 'none'" in reply.headers["Content-Security-Policy"]
        page = reply.body.decode()
        # The one script is the console's own refresh loop, from this origin.
        assert page.count("<script") == 1
        assert '<script src="/admin/live.js" defer></script>' in page
        assert "<b>" not in page
    for reply in (listing, one):
        assert str(job_id) in reply.body.decode()
        assert escaped in reply.body.decode()
    assert "<th>succeeded</th>" in overview.body.decode()
