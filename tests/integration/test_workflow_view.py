"""A workflow as an operator sees it (issue 20 item 1): ``jobsapp summary``'s workflows line
counts workflows by state (a cancelled one as failed), and the replay form on a failed
step's admin job page resumes its workflow, whose steps the same page then shows
succeeded."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from celery import chain
from flask.testing import FlaskClient
from sqlalchemy import Engine, select

from jobsapp import cli, operator
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.celery_api.group_handles import StepHandle
from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.lifecycle.journal.workflow import STEPS
from jobsapp.web.app import create_app
from tests.support import canvas_tasks as t
from tests.support.attachments import environment
from tests.support.planted import rolled_up
from tests.support.tasks import calls
from tests.support.waiting import eventually
from tests.support.web import log_in
from tests.support.workers import in_process_worker

pytestmark = pytest.mark.timeout(120)

WAIT = 20
ADMIN_TOKEN = "workflow-view-token-7f3a9c2e5b1d8064"
BASE = "http://admin.local"


def _token(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def _chain_failing_in_the_middle() -> tuple[StepHandle, tuple[str, str, str]]:
    """counted(1) | flaky_once (fails its first run for good) | counted: 2 once replayed."""
    tokens = (_token("first"), _token("once"), _token("last"))
    first, once, last = tokens
    handle = chain(t.counted.s(1, first), t.flaky_once.s(once, 1), t.counted.s(last)).apply_async()
    return handle, tokens


def _step(engine: Engine, workflow_id: uuid.UUID, path: str) -> uuid.UUID:
    with engine.connect() as conn:
        return uuid.UUID(
            str(
                conn.execute(
                    select(STEPS.c.job_id).where(
                        STEPS.c.workflow_id == workflow_id, STEPS.c.path == path
                    )
                ).scalar_one()
            )
        )


def _has_run(engine: Engine, job_id: uuid.UUID) -> bool:
    with engine.connect() as conn:
        return journal.load(conn, JOBS, job_id) is not None


def _failed(handle: StepHandle) -> None:
    with pytest.raises(ConnectionError, match="upstream down"):
        handle.get(timeout=WAIT)


@pytest.fixture
def admin() -> Iterator[FlaskClient]:
    with environment(JOBSAPP_ADMIN_TOKEN=ADMIN_TOKEN):
        client = create_app().test_client()
        log_in(client, BASE, ADMIN_TOKEN)
        yield client


def _page(admin: FlaskClient, job_id: uuid.UUID) -> str:
    reply = admin.get(f"/admin/jobs/jobs/{job_id}", base_url=BASE)
    assert reply.status_code == 200
    return reply.get_data(as_text=True)


def _steps_shown(page: str) -> list[tuple[str, str]]:
    """(state, outcome) of each row of the page's workflow table."""
    return re.findall(r'<td class="(\w+)">\w+</td><td>(\w*)</td></tr>', page)


def _workflows_line(capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["summary"]) == 0
    lines = capsys.readouterr().out.splitlines()
    return next(line for line in lines if line.startswith("workflows:"))


def test_the_summary_counts_workflows_by_state(
    pg: Engine, redis_clean: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with in_process_worker():
        done = chain(t.add.s(1, 2), t.add.s(3)).apply_async()
        assert done.get(timeout=WAIT) == 6
        failed, _ = _chain_failing_in_the_middle()
        _failed(failed)
    queued = chain(t.add.s(1, 1), t.add.s(1)).apply_async()  # no worker now: stays queued
    # Running workflows are read live; finished ones once beat's rollup counted them.
    assert _workflows_line(capsys) == "workflows: 1 running, 0 succeeded, 0 failed"
    rolled_up(pg)
    assert _workflows_line(capsys) == "workflows: 1 running, 1 succeeded, 1 failed"

    middle = _step(pg, failed.workflow_id, "0.1")
    replay = ["replay", str(middle), "--module", "jobs", "--reason", "upstream is back"]
    assert cli.main(replay) == 0
    # A replayed step is queued again: its workflow runs again.
    assert _workflows_line(capsys) == "workflows: 2 running, 1 succeeded, 0 failed"

    first = _step(pg, queued.workflow_id, "0.0")
    operator.cancel_workflow(pg, "jobs", first, actor="ops", reason="not needed")
    rolled_up(pg)
    assert _workflows_line(capsys) == "workflows: 1 running, 1 succeeded, 1 failed"


def test_a_failed_step_replayed_from_its_job_page_resumes_the_workflow(
    pg: Engine, redis_clean: None, admin: FlaskClient
) -> None:
    with in_process_worker():
        handle, (first, once, last) = _chain_failing_in_the_middle()
        _failed(handle)
        middle = _step(pg, handle.workflow_id, "0.1")
        page = _page(admin, middle)
        assert _steps_shown(page) == [
            ("succeeded", "succeeded"),
            ("failed", "exhausted"),
            ("blocked", "upstream_failed"),
        ]
        csrf = re.search(
            r'id="replay">\s*<input type="hidden" name="csrf_token" value="([^"]+)"', page
        )
        assert csrf is not None, "no replay form on the failed step's page"

        form = {"csrf_token": csrf[1], "reason": "upstream is back"}
        reply = admin.post(
            f"/admin/jobs/jobs/{middle}/replay", base_url=BASE, data=form, follow_redirects=True
        )
        assert "Replayed: attempt 2 is queued" in reply.get_data(as_text=True)
        # The last step stays blocked until the replayed one succeeds; then it runs.
        eventually(lambda: _has_run(pg, handle.job_id))
        assert handle.get(timeout=WAIT) == 2

    assert _steps_shown(_page(admin, middle)) == [("succeeded", "succeeded")] * 3
    assert (calls(first), calls(once), calls(last)) == (1, 2, 1)
