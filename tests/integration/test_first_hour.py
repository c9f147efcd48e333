"""A Celery user's first hour with lifecycle tasks: ``send_task`` by name and ``apply()``.

Written the way a Celery user writes them. Where Celery defines the answer (``send_task``
returns an ``AsyncResult``; ``apply()`` returns an ``EagerResult`` whose ``get()`` gives
the return value or raises the body's exception) the same call on a bare Celery task of
the same body stands beside it. What jobsapp adds is checked in the journal: every call
is a run there, with its attempts.
"""

from __future__ import annotations

import html
import logging
import re
import uuid
from collections.abc import Iterator

import pytest
from celery import Celery
from celery.result import AsyncResult, EagerResult
from kombu.exceptions import EncodeError
from sqlalchemy import Engine

from jobsapp.attachments.tasks import TASK_NAME as ATTACHMENT_TASK
from jobsapp.celery_app import app
from jobsapp.lifecycle.rules.message import task_id_for
from jobsapp.monitor import browse
from jobsapp.web.app import create_app
from tests.support import first_hour_tasks as hour
from tests.support.attachments import environment
from tests.support.journal_view import run_count, run_row, transitions
from tests.support.tasks import calls
from tests.support.waiting import eventually
from tests.support.web import log_in

pytestmark = pytest.mark.timeout(120)

ADMIN_TOKEN = "first-hour-admin-token-7f3a9c2e5b1d8064"
BASE = "http://admin.local"


@pytest.fixture
def pg_worker(pg: Engine, redis_clean: None) -> Iterator[object]:
    """The in-process worker on Postgres only (the lifecycle suite covers SQLite)."""
    from tests.support.workers import in_process_worker

    with in_process_worker() as w:
        yield w


@pytest.fixture
def elsewhere() -> Celery:
    """A service that does not import the tasks: a bare Celery app on the same broker."""
    other = Celery("elsewhere", broker=app.conf.broker_url)
    other.conf.task_default_queue = app.conf.task_default_queue
    return other


def _rejections(caplog: pytest.LogCaptureFixture, task_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith(f"rejected message {task_id} ")
    ]


# ------------------------------------------------------------------ send_task by name


def test_send_task_by_name_becomes_a_run_keyed_by_its_task_id(
    pg_worker: object, pg: Engine, elsewhere: Celery
) -> None:
    sent = elsewhere.send_task("tests.hour.add", (12, 30))
    assert isinstance(sent, AsyncResult)  # what Celery's send_task returns, unchanged
    handle = hour.add.AsyncResult(sent.id)
    assert handle.settled()["state"] == "succeeded"
    row = run_row(pg, uuid.UUID(sent.id))
    assert (row["task_name"], row["attempts"]) == ("tests.hour.add", 1)
    assert row["params"] == {"args": [12, 30], "kwargs": {}}


def test_send_task_keeps_its_keyword_arguments_and_retries_through_the_journal(
    pg_worker: object, pg: Engine, elsewhere: Celery
) -> None:
    token = f"shaky-{uuid.uuid4().hex[:8]}"
    sent = elsewhere.send_task("tests.hour.shaky", (token,), {"fail_times": 1})
    assert hour.shaky.AsyncResult(sent.id).settled()["state"] == "succeeded"
    row = run_row(pg, uuid.UUID(sent.id))
    assert row["attempts"] == 2
    assert row["params"] == {"args": [token], "kwargs": {"fail_times": 1}}
    assert calls(token) == 2


def test_the_admin_job_page_lists_each_attempts_celery_task_id(
    pg_worker: object, pg: Engine, elsewhere: Celery
) -> None:
    """The ids Flower lists: the send_task id for the first attempt, then the ids jobsapp
    published the retries under."""
    sent = elsewhere.send_task("tests.hour.shaky", (f"admin-{uuid.uuid4().hex[:8]}", 1))
    assert hour.shaky.AsyncResult(sent.id).settled()["state"] == "succeeded"
    with environment(JOBSAPP_ADMIN_TOKEN=ADMIN_TOKEN):
        client = create_app().test_client()
        log_in(client, BASE, ADMIN_TOKEN)
        page = client.get(f"/admin/jobs/jobs/{sent.id}", base_url=BASE).get_data(as_text=True)
    listed = re.findall(r'<td class="task-id"><code>([^<]*)</code>', page)
    assert listed == [sent.id, task_id_for(uuid.UUID(sent.id), 2)]


def test_a_redelivered_send_task_message_is_not_a_second_run(
    pg_worker: object, pg: Engine, elsewhere: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker delivers the same task id again (at-least-once): one run, one body."""
    caplog.set_level(logging.INFO, logger="jobsapp.lifecycle.worker.delivery")
    token = f"once-{uuid.uuid4().hex[:8]}"
    task_id = str(uuid.uuid4())
    for _ in range(2):
        elsewhere.send_task("tests.hour.shaky", (token, 0), task_id=task_id)
    job_id = uuid.UUID(task_id)
    assert hour.shaky.AsyncResult(task_id).settled()["state"] == "succeeded"
    no_work = f"job {job_id} attempt 1: no work"
    eventually(lambda: [r for r in caplog.records if r.getMessage().startswith(no_work)])
    assert calls(token) == 1
    assert transitions(pg, job_id).count("claim") == 1


def test_send_task_whose_arguments_do_not_fit_is_rejected_in_one_line(
    pg_worker: object, pg: Engine, elsewhere: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    too_many = elsewhere.send_task("tests.hour.add", (1, 2, 3))
    unknown = elsewhere.send_task("tests.hour.add", (1, 2), {"z": 3})
    domain = elsewhere.send_task(ATTACHMENT_TASK, kwargs={"attachment_id": str(uuid.uuid4())})
    (first,) = eventually(lambda: _rejections(caplog, too_many.id))
    assert first.endswith(": too many positional arguments; tests.hour.add takes (x, y)")
    (second,) = eventually(lambda: _rejections(caplog, unknown.id))
    assert "unexpected keyword argument 'z'" in second
    (third,) = eventually(lambda: _rejections(caplog, domain.id))
    assert "attachments tasks take the jobsapp message only" in third
    assert run_count(pg) == 0


def test_arguments_over_the_cap_are_refused_at_the_call_and_at_the_worker(
    pg_worker: object, pg: Engine, elsewhere: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """10 MB arguments were stored, through .delay and through a forged message (issue 35)."""
    big = "x" * 300_000
    over = r"are 3000\d\d bytes of JSON, over the cap of 262144 bytes \(JOBSAPP_ARGS_MAX_BYTES\)"
    with pytest.raises(EncodeError, match=rf"^the arguments of tests\.hour\.add {over}"):
        hour.add.delay(big, "y")
    forged = elsewhere.send_task("tests.hour.add", (big, "y"))
    (line,) = eventually(lambda: _rejections(caplog, forged.id))
    assert re.search(over, line)
    assert run_count(pg) == 0


def test_a_list_row_shows_the_head_of_large_arguments(pg: Engine) -> None:
    """A list page loaded every row's whole arguments (20 rows of 5 MB: +190 MB per
    render); it loads their head only, and the job's page still shows them."""
    handle = hour.add.delay("y" * 200_000, "z")
    with environment(JOBSAPP_ADMIN_TOKEN=ADMIN_TOKEN):
        client = create_app().test_client()
        log_in(client, BASE, ADMIN_TOKEN)
        listed = client.get("/admin/jobs?state=queued", base_url=BASE).get_data(as_text=True)
    (cell,) = re.findall(r'<td class="args"><code>([^<]*)</code>', listed)
    assert re.match(r'\{"args": ?\["yyyy', html.unescape(cell))
    assert len(html.unescape(cell)) <= 200
    page = browse.find_jobs(pg, browse.JobFilter(states=("queued",)))
    (row,) = page.rows
    loaded = page.extras[(row.module, row.job_id)].args
    assert len(str(loaded)) <= browse.ARGS_PREVIEW
    assert run_row(pg, handle.job_id)["params"]["args"][0] == "y" * 200_000


# ---------------------------------------------------------------------------- apply()


def test_apply_runs_the_body_through_the_journal_and_returns_its_value(pg: Engine) -> None:
    bare, ours = hour.bare_add.apply((11, 1)), hour.add.apply((11, 1))
    assert isinstance(ours, EagerResult)
    assert isinstance(bare, EagerResult)
    assert (ours.get(), ours.status, ours.successful()) == (bare.get(), bare.status, True)
    assert ours.get() == 12
    row = run_row(pg, uuid.UUID(ours.id))
    assert (row["state"], row["attempts"], row["params"]) == (
        "succeeded",
        1,
        {"args": [11, 1], "kwargs": {}},
    )
    # The run keeps the value too: a handle of the job answers as the EagerResult did.
    assert row["result"] == 12
    assert hour.add.AsyncResult(ours.id).get() == 12
    # The journal's idempotency by id, where Celery would run the body again.
    again = hour.add.apply((11, 1), task_id=ours.id)
    assert again.get() == "not run: the job is already terminal"


def test_apply_of_a_failing_body_raises_its_exception_after_its_attempts(pg: Engine) -> None:
    token = f"refuse-{uuid.uuid4().hex[:8]}"
    bare, ours = hour.bare_refuse.apply((f"bare-{token}",)), hour.refuse.apply((token,))
    assert ours.status == bare.status == "FAILURE"
    for result in (bare, ours):
        with pytest.raises(ValueError, match="no way"):
            result.get()
    row = run_row(pg, uuid.UUID(ours.id))
    assert (row["state"], row["outcome"], row["attempts"]) == ("failed", "exhausted", 2)
    assert calls(token) == 2  # the journal's retry ran here too, after its pause


def test_apply_retries_in_the_journal_until_the_body_succeeds(pg: Engine) -> None:
    token = f"shaky-{uuid.uuid4().hex[:8]}"
    result = hour.shaky.apply((token, 2))
    assert result.get() == f"{token} done"
    assert run_row(pg, uuid.UUID(result.id))["attempts"] == 3
    assert transitions(pg, uuid.UUID(result.id)).count("retry") == 2


def test_apply_with_arguments_that_do_not_fit_fails_like_a_call(pg: Engine) -> None:
    bare, ours = hour.bare_add.apply((1, 2, 3)), hour.add.apply((1, 2, 3))
    assert ours.status == bare.status == "FAILURE"
    with pytest.raises(TypeError, match="too many positional arguments"):
        ours.get()
    assert run_count(pg) == 0


@pytest.fixture
def always_eager() -> Iterator[None]:
    """``task_always_eager``, as a Celery user's test settings set it, on both apps."""
    for celery_app in (app, hour.bare):
        celery_app.conf.task_always_eager = True
    try:
        yield
    finally:
        for celery_app in (app, hour.bare):
            celery_app.conf.task_always_eager = False


def test_delay_under_task_always_eager_runs_here_like_celery(
    pg: Engine, always_eager: None
) -> None:
    bare, ours = hour.bare_add.delay(2, 3), hour.add.delay(2, 3)
    assert isinstance(ours, EagerResult)
    assert ours.get() == bare.get() == 5
    assert run_row(pg, uuid.UUID(ours.id))["state"] == "succeeded"
