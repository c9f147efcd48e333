"""An operator's cancel of a running job, through the journal path of
``app.control.revoke``: the request is stored, the body is told at its next beat, and
terminate is the fallback; by the function, the JSON API, the admin page and the CLI.
Also the admin job page's stored result. Against the real Postgres and Redis.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import Engine

from jobsapp import cli, operator
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.lifecycle.rules.states import Outcome, State, Transition
from jobsapp.web.app import create_app
from tests.support import tasks
from tests.support.attachments import environment
from tests.support.journal_view import events, held_by, run_row, transitions
from tests.support.waiting import eventually
from tests.support.web import log_in

pytestmark = pytest.mark.timeout(180)

TOKEN = "cancel-running-admin-token-7f3a9c2e5b1d8064"
BASE = "http://admin.local"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client() -> Iterator[FlaskClient]:
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        yield create_app().test_client()


def _handle(value: object) -> JobHandle:
    assert isinstance(value, JobHandle)
    return value


def _claimed_by_hand(engine: Engine) -> uuid.UUID:
    """A running job whose worker is this test (no body runs: nothing beats for it)."""
    handle = _handle(tasks.echo.delay(uuid.uuid4().hex))
    with engine.begin() as conn:
        assert journal.claim(conn, JOBS, handle.job_id, 1, worker="w1@host") is not None
    return handle.job_id


def _page(client: FlaskClient, job_id: uuid.UUID) -> str:
    return client.get(f"/admin/jobs/jobs/{job_id}", base_url=BASE).get_data(as_text=True)


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found is not None
    return found[1]


# ------------------------------------------------------------------ the function


@pytest.mark.usefixtures("worker")
def test_an_operators_cancel_stops_a_running_job_at_its_next_beat(
    db: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="jobsapp.lifecycle.worker.heartbeat")
    token = uuid.uuid4().hex
    running = _handle(tasks.looping.delay(token, 60.0))
    eventually(
        lambda: tasks.calls(token) == 1 and run_row(db, running.job_id)["state"] == State.RUNNING
    )

    done = operator.cancel(db, "jobs", running.job_id, actor="bob", reason="runaway report")

    assert (done.running, done.attempts, done.terminate_sent) == (True, 1, False)
    row = running.settled(timeout=30)
    assert (row["state"], row["outcome"]) == (State.FAILED, Outcome.CANCELLED)
    assert transitions(db, running.job_id) == [
        Transition.ENQUEUE,
        Transition.CLAIM,
        Transition.CANCEL_REQUEST,
        Transition.CANCEL,
    ]
    audit = events(db, running.job_id)[2]
    assert (audit["actor"], audit["reason"]) == ("operator:bob", "runaway report")
    assert tasks.calls(f"{token}-done") == 0  # stopped, not left to finish
    # The worker's log says what stopped it: a revoke, not a lease another worker took.
    said = [r.getMessage() for r in caplog.records if str(running.job_id) in r.getMessage()]
    assert f"job {running.job_id} attempt 1: revoked, stopping" in said, said
    assert not [line for line in said if "lease lost" in line], said


@pytest.mark.usefixtures("redis_clean")
def test_a_second_cancel_needs_terminate_and_is_audited(pg: Engine) -> None:
    job_id = _claimed_by_hand(pg)
    operator.cancel(pg, "jobs", job_id, actor="bob", reason="stop")

    with pytest.raises(operator.Conflict) as pending:
        operator.cancel(pg, "jobs", job_id, actor="bob", reason="stop!")
    assert pending.value.code == "cancel_pending"
    assert "with terminate" in str(pending.value)

    done = operator.cancel(pg, "jobs", job_id, actor="bob", reason="stuck in C", terminate=True)

    assert (done.running, done.terminate_sent) == (True, True)
    asked = [e for e in events(pg, job_id) if e["transition"] == Transition.CANCEL_REQUEST]
    assert [e["reason"] for e in asked] == ["stop", "stuck in C [terminate]"]
    assert run_row(pg, job_id)["state"] == State.RUNNING  # the reaper ends it, cancelled


def test_cancel_of_a_finished_job_is_refused(db: Engine) -> None:
    job_id = _claimed_by_hand(db)
    operator.cancel(db, "jobs", job_id, actor="bob", reason="stop")
    with db.begin() as conn:
        row = journal.load(conn, JOBS, job_id)
        assert row is not None
        assert journal.honour_cancel(
            conn, JOBS, job_id, 1, token=row.claimed_token, actor="w1@host"
        )

    with pytest.raises(operator.Conflict) as refused:
        operator.cancel(db, "jobs", job_id, actor="bob", reason="again")
    assert refused.value.code == "not_active"


# ----------------------------------------------------------------------- the API


def _cancel(client: FlaskClient, job_id: uuid.UUID, **body: Any) -> Any:
    return client.post(
        f"/v1/admin/jobs/jobs/{job_id}/cancel",
        headers=BEARER,
        json={"reason": "api says stop", **body},
    )


@pytest.mark.usefixtures("redis_clean")
def test_the_api_cancels_a_running_job(pg: Engine, client: FlaskClient) -> None:
    job_id = _claimed_by_hand(pg)

    asked = _cancel(client, job_id, actor="eve")
    again = _cancel(client, job_id)
    killed = _cancel(client, job_id, terminate=True)

    assert asked.status_code == 200, asked.get_json()
    assert asked.get_json() == {
        "module": "jobs",
        "job_id": str(job_id),
        "state": "running",
        "outcome": None,
        "attempts": 1,
        "cancel_requested": True,
        "terminate_sent": False,
    }
    assert (again.status_code, again.get_json()["error"]) == (409, "cancel_pending")
    assert killed.status_code == 200
    assert killed.get_json()["terminate_sent"] is True
    assert events(pg, job_id)[2]["actor"] == "operator:eve"


@pytest.mark.usefixtures("redis_clean")
def test_the_api_still_cancels_a_queued_job_at_once(pg: Engine, client: FlaskClient) -> None:
    job_id = _handle(tasks.echo.delay(uuid.uuid4().hex)).job_id

    reply = _cancel(client, job_id)

    assert reply.get_json() == {
        "module": "jobs",
        "job_id": str(job_id),
        "state": "failed",
        "outcome": "cancelled",
        "attempts": 0,
        "cancel_requested": False,
        "terminate_sent": False,
    }


# ------------------------------------------------------------------- the job page


@pytest.mark.usefixtures("redis_clean")
def test_the_job_page_cancels_a_running_job_and_shows_the_request(
    pg: Engine, client: FlaskClient
) -> None:
    job_id = _claimed_by_hand(pg)
    log_in(client, BASE, TOKEN)
    page = _page(client, job_id)
    assert 'id="cancel"' in page
    assert "Cancel" in page

    reply = client.post(
        f"/admin/jobs/jobs/{job_id}/cancel",
        base_url=BASE,
        data={"csrf_token": _csrf(page), "reason": "from the page", "attempts": "1"},
    )

    assert reply.status_code == 303
    shown = _page(client, job_id)
    assert 'id="cancel-pending"' in shown
    assert re.search(r'<dt>cancel requested</dt><dd id="cancel-requested">\d{4}-', shown)
    assert 'name="terminate"' in shown  # the fallback is offered now
    assert events(pg, job_id)[-1]["actor"] == "operator:dana"


# ------------------------------------------------------------------------ the CLI


@pytest.mark.usefixtures("redis_clean")
def test_the_cli_cancels_a_running_job_then_terminates_it(
    pg: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = _claimed_by_hand(pg)
    args = ["cancel", str(job_id), "--module", "jobs", "--reason", "cli", "--actor", "carol"]

    assert cli.main(args) == 0
    assert "asked to stop at its next heartbeat" in capsys.readouterr().out
    assert cli.main(args) == 1
    assert "refused (cancel_pending)" in capsys.readouterr().err
    assert cli.main([*args, "--terminate"]) == 0
    assert "terminate sent" in capsys.readouterr().out


# ------------------------------------------------------------- the stored result


def _succeeded_with(engine: Engine, result: object) -> uuid.UUID:
    job_id = _claimed_by_hand(engine)
    with engine.begin() as conn:
        assert journal.succeed(
            conn, JOBS, job_id, 1, token=held_by(conn, JOBS, job_id), actor="w1@host", result=result
        )
    return job_id


@pytest.mark.usefixtures("redis_clean")
def test_the_job_page_shows_the_stored_result_escaped(pg: Engine, client: FlaskClient) -> None:
    job_id = _succeeded_with(pg, {"html": "<script>alert(1)</script>", "n": 7})
    log_in(client, BASE, TOKEN)

    shown = _page(client, job_id)

    result = shown.split('id="result"', 1)[1].split("</section>", 1)[0]
    assert "<script>" not in result
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in result
    assert "<details" not in result  # short: shown whole, nothing to expand


@pytest.mark.usefixtures("redis_clean")
def test_a_long_result_is_cut_on_the_page_and_whole_when_expanded(
    pg: Engine, client: FlaskClient
) -> None:
    items = [f"item-{n:04d}" for n in range(400)]
    job_id = _succeeded_with(pg, {"items": items})
    log_in(client, BASE, TOKEN)

    result = _page(client, job_id).split('id="result"', 1)[1].split("</section>", 1)[0]

    summary, expanded = result.split("</summary>", 1)
    assert "<details" in summary
    assert "item-0000" in summary
    assert "item-0399" not in summary  # cut
    assert all(item in expanded for item in items)  # the whole value on expand
