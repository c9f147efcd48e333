"""An operator runs a reconcile pass from the admin page: logged in, with the CSRF token."""

from __future__ import annotations

import re

from flask.testing import FlaskClient
from sqlalchemy import Engine

from jobsapp.web.app import create_app
from tests.support.attachments import environment
from tests.support.journal_view import events, run_row
from tests.support.planted import failed_generic_job
from tests.support.web import csrf_of

TOKEN = "reconcile-page-token-7f3a9c2e5b1d8064"
BASE = "http://admin.local"


def signed_in(client: FlaskClient) -> str:
    """Log in through the form; returns the overview page as the operator sees it."""
    form = client.get("/admin/login", base_url=BASE).get_data(as_text=True)
    client.post(
        "/admin/login",
        base_url=BASE,
        data={"csrf_token": csrf_of(form), "token": TOKEN, "name": "rita"},
    )
    return client.get("/admin", base_url=BASE).get_data(as_text=True)


def test_the_overview_offers_a_pass_that_takes_failures_again(db: Engine) -> None:
    outage = failed_generic_job(db, "TransientError: upstream down")
    other = failed_generic_job(db, "KeyError: 'x'")
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        client = create_app().test_client()
        overview = signed_in(client)
        assert 'id="reconcile"' in overview
        forged = client.post("/admin/reconcile", base_url=BASE, data={"module": "jobs"})
        dry = client.post(
            "/admin/reconcile",
            base_url=BASE,
            data={"csrf_token": csrf_of(overview), "module": "jobs", "dry_run": "1"},
        )
        assert run_row(db, outage)["state"] == "failed"
        real = client.post(
            "/admin/reconcile",
            base_url=BASE,
            data={"csrf_token": csrf_of(overview), "module": "jobs"},
        )

    assert forged.status_code == 400
    assert dry.status_code == 200
    assert str(outage) in dry.get_data(as_text=True)
    held = re.search(r'<table id="held-back">.*?</table>', dry.get_data(as_text=True), re.S)
    assert held is not None
    assert str(other) in held[0]
    assert "error code not retryable: the error carries none of TransientError" in held[0]
    assert real.status_code == 200
    assert str(outage) in real.get_data(as_text=True)
    assert run_row(db, outage)["state"] == "queued"
    replays = [e for e in events(db, outage) if e["transition"] == "replay"]
    assert [e["actor"] for e in replays] == ["operator:reconcile:rita"]


def test_a_bulk_replay_naming_one_job_many_times_replays_it_once(db: Engine) -> None:
    job = failed_generic_job(db, "TransientError: upstream down")
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        client = create_app().test_client()
        overview = signed_in(client)
        # A crafted POST (a valid CSRF token) repeats the job: it replayed 13 times.
        answer = client.post(
            "/admin/replay",
            base_url=BASE,
            data={
                "csrf_token": csrf_of(overview),
                "reason": "upstream is back",
                "job": [f"jobs:{job}"] * 13,
            },
        )

    assert answer.status_code == 200, answer.get_data(as_text=True)[:500]
    replays = [e for e in events(db, job) if e["transition"] == "replay"]
    assert len(replays) == 1
    assert run_row(db, job)["state"] == "queued"


def test_a_nul_in_an_error_code_is_a_400_with_its_reason(db: Engine) -> None:
    """A NUL in reconcile's error code reached PostgreSQL: a 500 (issue 35, item 7)."""
    del db  # a migrated journal, emptied
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        client = create_app().test_client()
        overview = signed_in(client)
        form = client.post(
            "/admin/reconcile",
            base_url=BASE,
            data={"csrf_token": csrf_of(overview), "error_code": "transient\x00x"},
        )
        api = client.post(
            "/v1/admin/reconcile",
            base_url=BASE,
            json={"error_code": "transient\x00x"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    assert form.status_code == 400
    assert "an error code cannot hold a NUL character" in form.get_data(as_text=True)
    assert (api.status_code, api.get_json()["error"]) == (400, "bad_request")
    assert "NUL" in api.get_json()["reason"]
