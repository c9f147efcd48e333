"""The admin UI in a real headless Chromium (Debian's, driven by Playwright) against
`jobsapp web` and a Celery worker: log in, filter, read an attempt's error, replay to
success, bulk replay, cancel, CSRF refusals, paging, and the attachment/job cross-links.

With ``JOBSAPP_SCREENSHOTS=docs/img`` the pages are also saved as PNGs for
docs/operators.md (CI leaves the tracked images alone).
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from celery import Celery
from playwright.sync_api import Browser, Page
from sqlalchemy import Engine, text

from jobsapp import operator
from tests.e2e.browser import chromium
from tests.support import tasks
from tests.support.attachments import png
from tests.support.console_e2e import (
    REFUSAL,
    SCREENSHOTS,
    TOKEN,
    deployment_engine,
    enqueue,
    log_in_page,
    operator_env,
    operator_events,
    state_of,
    wait_state,
)
from tests.support.env import SESSION
from tests.support.servers import RedisServer
from tests.support.webserver import REPO, Http, running_web, running_worker

DATABASE = f"jobsapp_e2e_admin_ui_{SESSION}"
VIEWPORT = {"width": 1280, "height": 800}

pytestmark = pytest.mark.timeout(180)


# --------------------------------------------------------------------------- services


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory, module_redis: RedisServer
) -> Iterator[dict[str, str]]:
    with operator_env(tmp_path_factory, DATABASE, module_redis) as found:
        yield found


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-admin-ui-logs")


@pytest.fixture(scope="module")
def http(env: dict[str, str], logs: Path) -> Iterator[Http]:
    with running_web(env, logs / "web.log") as client:
        yield client


@pytest.fixture(scope="module")
def worker(env: dict[str, str], logs: Path) -> Iterator[Path]:
    with running_worker(env, logs / "worker.log") as log:
        yield log


@pytest.fixture(scope="module")
def db(env: dict[str, str]) -> Iterator[Engine]:
    with deployment_engine(env) as engine:
        yield engine


@pytest.fixture(scope="module")
def broker(env: dict[str, str]) -> Celery:
    return Celery("e2e-admin-ui-producer", broker=env["JOBSAPP_BROKER_URL"])


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as found:
        yield found


@pytest.fixture
def page(browser: Browser, http: Http) -> Iterator[Page]:
    """A fresh browser profile (no cookies) on the app."""
    context = browser.new_context(base_url=http.base_url, viewport=VIEWPORT)
    try:
        yield context.new_page()
    finally:
        context.close()


# ----------------------------------------------------------------------------- helpers


def shot(page: Page, name: str) -> None:
    if SCREENSHOTS:
        folder = REPO / SCREENSHOTS
        folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(folder / f"admin-{name}.png"))


def failed_job(db: Engine, broker: Celery, worker: Path) -> uuid.UUID:
    job_id = enqueue(db, tasks.fails_once, f"ui-{uuid.uuid4()}", publish=broker)
    wait_state(db, job_id, "failed", worker)
    return job_id


def page_shows_state(page: Page, state: str) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if page.inner_text("#state") == state:
            return True
        time.sleep(0.3)
        page.reload()
    return False


def read(http: Http, path: str) -> str:
    """A page as curl would read it, with the bearer token."""
    reply = http.request(path, headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.status == 200, reply.body
    return reply.body.decode()


def listed_ids(body: str) -> list[str]:
    return re.findall(r"<code>([0-9a-f-]{36})</code></a></td>", body)


def csrf_of(page: Page) -> str:
    value = page.get_attribute("input[name=csrf_token]", "value")
    assert value
    return value


# ------------------------------------------------------------------------------ tests


def test_an_operator_logs_in_finds_a_failed_job_reads_its_error_and_replays_it(
    page: Page, db: Engine, broker: Celery, worker: Path
) -> None:
    job_id = failed_job(db, broker, worker)
    done = enqueue(db, tasks.echo, f"ui-ok-{uuid.uuid4()}", publish=broker)
    wait_state(db, done, "succeeded", worker)

    log_in_page(page)
    assert page.url.endswith("/admin")
    assert "signed in as alice" in page.inner_text("header")
    assert {"jobs", "attachments"} <= set(re.findall(r"^(\w+)\t", page.inner_text("#counts"), re.M))
    shot(page, "overview")
    page.click("header a:has-text('Jobs')")
    page.select_option("select[name=module]", "jobs")
    page.check("input[name=state][value=failed]")
    page.click("button:has-text('Filter')")
    listed = page.inner_text("#jobs")
    assert str(job_id) in listed
    assert str(done) not in listed
    rows = [row.split("\t") for row in listed.splitlines() if re.search(r"[0-9a-f-]{36}", row)]
    assert {cells[4] for cells in rows} == {"failed"}
    shot(page, "jobs")
    page.click(f"a:has-text('{job_id}')")

    assert page.inner_text("#state") == "failed"
    first = page.locator("#attempts tr").nth(1).inner_text()
    assert "failed" in first
    assert f"PermanentError: {REFUSAL}" in first
    assert json.loads(page.inner_text("#params"))["args"][0].startswith("ui-")
    shot(page, "job")
    page.fill("#replay input[name=reason]", "upstream fixed")
    page.click("#replay button")

    assert "Replayed: attempt 2 is queued" in page.inner_text(".flash.ok")
    assert page_shows_state(page, "succeeded")
    second = page.locator("#attempts tr").nth(2).inner_text()
    assert "succeeded" in second
    assert operator_events(db, job_id) == [("replay", "operator:alice", "upstream fixed")]


def test_the_session_cookie_is_http_only_strict_and_ends_at_logout(page: Page) -> None:
    log_in_page(page)

    (cookie,) = page.context.cookies()
    assert (cookie["name"], cookie["path"]) == ("jobsapp_admin", "/admin")
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert TOKEN not in cookie["value"]
    page.click("header button:has-text('Log out')")
    assert "/admin/login" in page.url
    page.goto("/admin/jobs")
    assert "/admin/login" in page.url


def test_a_wrong_token_does_not_log_in(page: Page) -> None:
    log_in_page(page, token="not-" + TOKEN)

    assert "That is not the admin token." in page.inner_text("main")
    page.goto("/admin")
    assert "/admin/login" in page.url


def test_a_post_without_the_csrf_token_is_refused(page: Page, db: Engine) -> None:
    job_id = enqueue(db, tasks.echo, "csrf-victim")
    log_in_page(page)
    page.goto(f"/admin/jobs/jobs/{job_id}")
    url = f"/admin/jobs/jobs/{job_id}/cancel"
    forms: list[dict[str, Any]] = [
        {"reason": "forged"},
        {"reason": "forged", "csrf_token": "guess"},
    ]

    refused = [page.request.post(url, form=form, max_redirects=0) for form in forms]

    assert [r.status for r in refused] == [400, 400]
    assert "CSRF token is missing" in refused[0].text()
    assert state_of(db, job_id) == "queued"
    assert operator_events(db, job_id) == []
    genuine = {"reason": "not wanted", "csrf_token": csrf_of(page)}
    assert page.request.post(url, form=genuine, max_redirects=0).status == 303
    assert state_of(db, job_id) == "failed"


def test_cancel_from_the_job_page(page: Page, db: Engine) -> None:
    job_id = enqueue(db, tasks.echo, "cancel-me")
    log_in_page(page, name="bob")
    page.goto(f"/admin/jobs/jobs/{job_id}")

    page.fill("#cancel input[name=reason]", "duplicate order")
    page.click("#cancel button")

    assert "Cancelled." in page.inner_text(".flash.ok")
    assert page.inner_text("#state") == "failed"
    assert operator_events(db, job_id) == [("cancel", "operator:bob", "duplicate order")]
    assert page.locator("#cancel").count() == 0


def test_cancel_of_a_running_job_from_the_job_page(
    page: Page, db: Engine, broker: Celery, worker: Path
) -> None:
    job_id = enqueue(db, tasks.looping, f"ui-loop-{uuid.uuid4().hex[:8]}", 60.0, publish=broker)
    wait_state(db, job_id, "running", worker)
    log_in_page(page, name="bob")
    page.goto(f"/admin/jobs/jobs/{job_id}")

    page.fill("#cancel input[name=reason]", "runaway report")
    page.click("#cancel button")

    assert "Asked to stop" in page.inner_text(".flash.ok")
    assert page_shows_state(page, "failed")  # told at its next heartbeat, ended cancelled
    assert operator_events(db, job_id) == [("cancel_request", "operator:bob", "runaway report")]
    assert page.locator("#cancel").count() == 0


def test_bulk_replay_of_a_filtered_set_asks_for_confirmation(
    page: Page, db: Engine, broker: Celery, worker: Path
) -> None:
    jobs = [failed_job(db, broker, worker) for _ in range(3)]
    log_in_page(page, name="carol")
    page.goto("/admin/jobs?module=jobs&state=failed&task=tests.fails_once")

    page.click("a:has-text('Replay the failed jobs of this filter')")
    assert all(str(j) in page.inner_text("#jobs") for j in jobs)
    assert all(state_of(db, j) == "failed" for j in jobs)
    page.fill("#bulk input[name=reason]", "provider recovered")
    shot(page, "bulk-confirm")
    page.click("#bulk button")

    heading = page.inner_text("h1")
    assert re.fullmatch(r"Replayed (\d+) of \1", heading), heading
    for job_id in jobs:
        wait_state(db, job_id, "succeeded", worker)
        assert operator_events(db, job_id) == [("replay", "operator:carol", "provider recovered")]


def test_a_bulk_replay_needs_a_reason_and_takes_only_the_confirmed_jobs(
    page: Page, db: Engine
) -> None:
    job_id = enqueue(db, tasks.echo, "cancelled-then-replayed")
    operator.cancel(db, "jobs", job_id, actor="test", reason="set up a failed job")
    log_in_page(page, name="erin")
    page.goto("/admin/jobs")
    confirmed = {"csrf_token": csrf_of(page), "job": f"jobs:{job_id}"}

    empty = page.request.post("/admin/replay", form={**confirmed, "reason": " "})

    assert empty.status == 400
    assert "a reason of 1 to 500 characters is required" in empty.text()
    assert state_of(db, job_id) == "failed"
    keys = [f"jobs:{job_id}", "jobs:not-a-job", f"nope:{uuid.uuid4()}", f"jobs:{uuid.uuid4()}"]
    fields = [("csrf_token", confirmed["csrf_token"]), ("reason", "retry it")]
    body = urlencode([*fields, *(("job", key) for key in keys)])
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    done = page.request.post("/admin/replay", data=body, headers=form)

    assert done.status == 200
    assert "Replayed 1 of 4" in done.text()
    assert state_of(db, job_id) != "failed"
    assert operator_events(db, job_id)[-1] == ("replay", "operator:erin", "retry it")


def test_dead_outbox_rows_are_on_the_overview_and_go_back_to_the_relay(
    page: Page, db: Engine, worker: Path
) -> None:
    job_id = enqueue(db, tasks.echo, "dead-letter")
    with db.begin() as conn:
        conn.execute(
            text(
                "UPDATE outbox SET dead_at = now(), publish_failures = 5, "
                "last_error = 'no worker takes tests.echo' WHERE job_id = :j"
            ),
            {"j": job_id},
        )
    log_in_page(page, name="frank")

    assert int(page.inner_text("#dead-total")) >= 1
    dead = page.inner_text("#dead")
    assert str(job_id) in dead
    assert "no worker takes tests.echo" in dead
    page.fill("#retry-dead input[name=reason]", "worker deployed")
    page.click("#retry-dead button")

    assert "dead outbox rows are due again" in page.inner_text(".flash.ok")
    assert page.inner_text("#dead-total") == "0"
    wait_state(db, job_id, "succeeded", worker)


def test_paging_walks_every_matching_job_once(http: Http, db: Engine) -> None:
    mine = {enqueue(db, tasks.echo, f"page-{i}") for i in range(57)}
    path: str | None = "/admin/jobs?module=jobs&state=queued&task=tests.echo"
    seen: list[str] = []
    totals = set()

    while path is not None:
        body = read(http, path)
        totals.add(int(re.search(r'id="total">(\d+) matching', body)[1]))  # type: ignore[index]
        seen += listed_ids(body)
        older = re.search(r'<a href="([^"]+)" rel="next"', body)
        path = html.unescape(older[1]) if older else None

    assert len(seen) == len(set(seen))
    assert {str(j) for j in mine} <= set(seen)
    assert totals == {len(seen)}


def test_an_attachment_and_its_job_link_to_each_other(
    page: Page, http: Http, env: dict[str, str], worker: Path
) -> None:
    upload = http.post_file(png(), "cat.png", "image/png")
    assert upload.status == 202, upload.body
    attachment_id = upload.json()["id"]
    view = _ready(http, attachment_id)

    job = view["job"]
    assert (job["module"], job["attempt"], job["state"]) == ("attachments", 1, "succeeded")
    log_in_page(page)
    page.goto(f"/admin/jobs?attachment={attachment_id}")
    assert page.locator("#jobs tr").count() == 2
    page.click(f"a:has-text('{job['job_id']}')")
    assert attachment_id in page.inner_text("#attachment")
    assert "thumbnail" in page.inner_text("#variants")
    # The variant links open in the signed-in browser: its session cookie never reaches /v1.
    link = page.get_attribute("#variants a:has-text('thumbnail')", "href")
    assert link == f"/admin/attachments/{attachment_id}/variants/thumbnail"
    shown = page.request.get(link, max_redirects=0)
    assert shown.status in (200, 302), shown.status
    shot(page, "attachment-job")
    cli = subprocess.run(
        [sys.executable, "-m", "jobsapp.cli", "summary", "--attachment", attachment_id, "--json"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert [row["job_id"] for row in json.loads(cli.stdout)] == [job["job_id"]]


def _ready(http: Http, attachment_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view: dict[str, Any] = http.get(f"/v1/attachments/{attachment_id}").json()
        if view["state"] == "ready":
            return view
        time.sleep(0.3)
    raise AssertionError(f"attachment {attachment_id} never ready: {view}")


def test_a_later_page_does_not_shift_when_new_jobs_arrive(http: Http, db: Engine) -> None:
    older = [enqueue(db, tasks.echo, f"stable-{i}") for i in range(3)]
    with db.connect() as conn:
        stamp = conn.execute(
            text("SELECT updated_at FROM job_runs WHERE job_id = :j"), {"j": older[-1]}
        ).scalar_one()
    after = quote(f"{stamp.isoformat()}~{older[-1]}")
    path = f"/admin/jobs?module=jobs&state=queued&task=tests.echo&after={after}"

    before = listed_ids(read(http, path))
    enqueue(db, tasks.echo, "newer")
    again = listed_ids(read(http, path))

    assert before == again
    assert before[:2] == [str(older[1]), str(older[0])]
