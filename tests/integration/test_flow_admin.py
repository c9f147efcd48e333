"""Pausing and resuming as an operator does it: the JSON API, the admin pages, the command
line, and the gauges of /metrics/cluster; every action leaves an audit row."""

from __future__ import annotations

import re
import uuid

import pytest
from flask.testing import FlaskClient
from jsonschema import Draft202012Validator
from sqlalchemy import Engine

from jobsapp import cli, flow_control
from jobsapp.lifecycle.flow import gating
from jobsapp.lifecycle.journal import flow_rows as statements
from jobsapp.web.app import create_app
from tests.support import flow_tasks
from tests.support.attachments import environment
from tests.support.web import csrf_of, sample, scrape

BASE = "http://admin.local"
TOKEN = "flow-admin-token-7f3a9c2e5b1d8064"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    # One process: nobody else needs a second to see the pause.
    monkeypatch.setattr(gating, "PAUSES_SEEN_WITHIN", 0.0)


def documented(client: FlaskClient, schema: str, instance: object) -> None:
    """The answer has the shape /openapi.json promises for it."""
    components = client.get("/openapi.json").get_json()["components"]
    Draft202012Validator(
        {"$ref": f"#/components/schemas/{schema}", "components": components}
    ).validate(instance)


def _api(client: FlaskClient, kind: str, name: str, action: str, **body: str) -> dict[str, object]:
    reply = client.post(
        f"/v1/admin/flow/{kind}/{name}/{action}",
        headers=AUTH,
        json={"reason": "deploy", "actor": "dana", **body},
    )
    assert reply.status_code == 200, reply.get_data(as_text=True)
    return dict(reply.get_json())


@pytest.mark.parametrize(
    ("body", "said"),
    [
        # Nested past Python's recursion limit: it was a RecursionError, a 500.
        ("[" * 100_000 + "]" * 100_000, "must be a JSON object"),
        # A line break and a terminal's escape sequence were stored, and printed raw by
        # ``jobsapp queue list``; a NUL was refused already.
        ('{"reason": "line1\\nline2\\u001b[31mRED"}', "U+000A"),
        ('{"reason": "deploy \\u202egpj.exe"}', "U+202E"),
        ('{"reason": "a\\u0000b"}', "U+0000"),
    ],
)
def test_a_body_the_api_cannot_take_is_a_400_with_its_reason_and_changes_nothing(
    pg: Engine, body: str, said: str
) -> None:
    queue = f"refused-{uuid.uuid4().hex[:8]}"
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        client = create_app().test_client()
        reply = client.post(
            f"/v1/admin/flow/queue/{queue}/pause",
            headers={**AUTH, "Content-Type": "application/json"},
            data=body,
        )

    assert reply.status_code == 400, reply.get_data(as_text=True)[:300]
    assert said in reply.get_json()["reason"]
    assert queue not in {p.name for p in flow_control.paused(pg)}


def test_a_json_body_over_the_limit_is_413_without_the_uploads_wording(pg: Engine) -> None:
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        client = create_app().test_client()
        limit = client.application.config["MAX_CONTENT_LENGTH"]
        reply = client.post(
            "/v1/admin/flow/queue/q/pause",
            headers={**AUTH, "Content-Type": "application/json"},
            data=b'{"reason": "' + b"x" * limit + b'"}',
        )

    assert reply.status_code == 413
    assert reply.get_json()["reason"] == f"The request is larger than the limit of {limit} bytes."


def test_the_api_pauses_and_resumes_a_queue_audited_and_the_gauge_follows(pg: Engine) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        client = create_app().test_client()
        first = _api(client, "queue", queue, "pause")
        again = _api(client, "queue", queue, "pause")
        state = client.get("/v1/admin/flow", headers=AUTH).get_json()
        while_paused = scrape()
        _api(client, "queue", queue, "resume")
        unknown = client.post(
            "/v1/admin/flow/domain/nosuch/pause", headers=AUTH, json={"reason": "x"}
        )
        no_reason = client.post(f"/v1/admin/flow/queue/{queue}/pause", headers=AUTH, json={})
    documented(client, "FlowChanged", first)
    documented(client, "FlowState", state)
    assert (first["paused"], first["changed"], again["changed"]) == (True, True, False)
    assert [(p["kind"], p["name"], p["paused_by"]) for p in state["paused"]] == [
        ("queue", queue, "operator:dana")
    ]
    assert sample(while_paused, "jobsapp_queue_paused", queue=queue) == 1
    assert sample(scrape(), "jobsapp_queue_paused", queue=queue) == 0
    assert sample(scrape(), "jobsapp_domain_paused", module="jobs") == 0
    assert (unknown.status_code, no_reason.status_code) == (404, 400)
    with pg.connect() as conn:
        trail = statements.audit_trail(conn, limit=10)
    assert [(a["action"], a["name"], a["actor"], a["reason"]) for a in trail] == [
        ("resume", queue, "operator:dana", "deploy"),
        ("pause", queue, "operator:dana", "deploy"),
    ]


def test_the_admin_pages_show_and_change_what_is_paused(pg: Engine) -> None:
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        client = create_app().test_client()
        form = client.get("/admin/login", base_url=BASE).get_data(as_text=True)
        client.post(
            "/admin/login",
            base_url=BASE,
            data={"csrf_token": csrf_of(form), "token": TOKEN, "name": "rita"},
        )
        page = client.get("/admin/queues", base_url=BASE).get_data(as_text=True)
        assert "Pause domain" in page
        rates = re.search(r'<table id="rates">.*?</table>', page, re.S)
        assert rates is not None
        assert f"<td>{flow_tasks.rated.name}</td><td>{flow_tasks.RATE}/s</td>" in rates[0]
        done = client.post(
            "/admin/flow",
            base_url=BASE,
            follow_redirects=True,
            data={
                "csrf_token": csrf_of(page),
                "kind": "domain",
                "name": "jobs",
                "action": "pause",
                "reason": "migrating",
            },
        )
        overview = client.get("/admin", base_url=BASE).get_data(as_text=True)
        client.post(
            "/admin/flow",
            base_url=BASE,
            data={
                "csrf_token": csrf_of(page),
                "kind": "domain",
                "name": "jobs",
                "action": "resume",
                "reason": "done",
            },
        )
    assert "domain jobs paused." in done.get_data(as_text=True)
    assert "Resume domain" in done.get_data(as_text=True)
    assert '<table id="paused">' in overview
    assert "operator:rita" in overview
    assert "migrating" in overview
    assert flow_control.paused(pg) == []


def test_the_command_line_pauses_lists_and_resumes(
    pg: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    assert cli.main(["queue", "pause", queue, "--reason", "deploy", "--actor", "sam"]) == 0
    assert cli.main(["queue", "list"]) == 0
    assert cli.main(["queue", "resume", queue, "--reason", "done", "--actor", "sam"]) == 0
    assert cli.main(["queue", "resume", queue, "--reason", "done", "--actor", "sam"]) == 0
    assert cli.main(["domain", "pause", "nosuch", "--reason", "x"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"queue {queue} paused"
    assert out[1].startswith(f"{queue}\tpaused ")
    assert out[1].endswith("by operator:sam: deploy")
    assert out[2:] == [f"queue {queue} resumed", f"queue {queue} was already resumed"]
    assert flow_control.paused(pg) == []
