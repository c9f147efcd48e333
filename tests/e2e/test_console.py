"""The operators' console in a real headless Chromium (Playwright) against `jobsapp web` and
a Celery worker, on a journal holding jobs in every state on two domains: each page is
read as an operator sees it and compared with the journal; live refresh and its pause;
bulk cancel of ticked rows; run now; accessibility (axe-core) at a desktop and a narrow
width.

With ``JOBSAPP_SCREENSHOTS=docs/img`` every page is saved at both widths for
docs/operators.md.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from playwright.sync_api import Browser, Page, Request
from sqlalchemy import Engine, create_engine, text

from tests.e2e.test_admin_ui import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS, log_in, wait_state
from tests.e2e.test_admin_web import enqueue, operator_env, operator_events
from tests.e2e.test_web import png
from tests.e2e.webserver import REPO, Http, running_web, running_worker
from tests.support import tasks
from tests.support.env import IN_CI

DATABASE = "jobsapp_e2e_console"
# Its own Redis database (see test_admin_web.py for the others').
REDIS_DB = 9
DESKTOP = {"width": 1280, "height": 900}
NARROW = {"width": 390, "height": 844}
# A credential in a job's arguments: the list must mask it, the search must find the job.
SECRET = "pw-" + uuid.uuid4().hex[:12]
SECRET_URL = f"postgresql://app:{SECRET}@db.internal/jobs"
NOBODY_QUEUE = "nobody-consumes-this"

pytestmark = pytest.mark.timeout(240)


# --------------------------------------------------------------------------- services


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with operator_env(tmp_path_factory, DATABASE, REDIS_DB) as found:
        yield found


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-console-logs")


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
    engine = create_engine(env["JOBSAPP_DATABASE_URL"])
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def broker(env: dict[str, str]) -> Celery:
    return Celery("e2e-console-producer", broker=env["JOBSAPP_BROKER_URL"])


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: scripts/install-services.sh installs chromium"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, http: Http) -> Iterator[Page]:
    context = browser.new_context(base_url=http.base_url, viewport=DESKTOP)
    try:
        yield context.new_page()
    finally:
        context.close()


# --------------------------------------------------------------------------- the journal


@pytest.fixture(scope="module")
def seeded(db: Engine, broker: Celery, worker: Path, http: Http) -> dict[str, uuid.UUID]:
    """Jobs in every state on two domains (generic jobs and attachments)."""
    jobs = {
        "succeeded": enqueue(db, tasks.echo, f"ok-{uuid.uuid4()}", publish=broker),
        "failed": enqueue(db, tasks.fails_once, f"bad-{uuid.uuid4()}", publish=broker),
        "running": enqueue(db, tasks.sleepy, f"slow-{uuid.uuid4()}", 900.0, publish=broker),
        "scheduled": enqueue(db, tasks.paused, f"later-{uuid.uuid4()}", 3600.0, publish=broker),
        "secret": enqueue(db, tasks.flaky, f"args-{uuid.uuid4()}", 0, SECRET_URL),
        "queued": enqueue(db, tasks.echo, f"waits-{uuid.uuid4()}"),
        "dead": enqueue(db, tasks.echo, f"dead-{uuid.uuid4()}"),
    }
    with db.begin() as conn:
        conn.execute(text("UPDATE outbox SET dead_at = now(), publish_failures = 5, "
                          "last_error = 'no worker takes it' WHERE job_id = :j"),
                     {"j": jobs["dead"]})  # fmt: skip
        conn.execute(text("UPDATE job_runs SET queue = :q WHERE job_id = :j"),
                     {"q": NOBODY_QUEUE, "j": jobs["queued"]})  # fmt: skip
    upload = http.post_file(png(), "cat.png", "image/png")
    assert upload.status == 202, upload.body
    for name in ("succeeded", "failed"):
        wait_state(db, jobs[name], name, worker)
    _wait(lambda: _state(db, jobs["running"]) == "running", "sleepy never ran")
    _wait(lambda: _next_retry(db, jobs["scheduled"]) is not None, "paused never snoozed")
    _wait(lambda: _count(db, "attachment_runs", "succeeded") >= 1, "the upload never ran")
    return jobs


def _wait(ready: Callable[[], bool], why: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    raise AssertionError(why)


def _scalar(db: Engine, sql: str, **params: Any) -> Any:
    with db.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def _state(db: Engine, job_id: uuid.UUID) -> str | None:
    return _scalar(db, "SELECT state FROM job_runs WHERE job_id = :j", j=job_id)  # type: ignore[no-any-return]


def _next_retry(db: Engine, job_id: uuid.UUID) -> Any:
    return _scalar(db, "SELECT next_retry_at FROM job_runs WHERE job_id = :j AND state = "
                   "'queued' AND next_retry_at > now()", j=job_id)  # fmt: skip


def _count(db: Engine, table: str, state: str) -> int:
    return int(_scalar(db, f"SELECT count(*) FROM {table} WHERE state = :s", s=state))


def _row(page: Page, table: str, needle: str) -> str:
    for row in page.locator(f"#{table} tr").all_inner_texts():
        if needle in row:
            return row
    raise AssertionError(f"no row of #{table} holds {needle!r}")


def _cells(page: Page, table: str) -> list[dict[str, str]]:
    """The table's rows as {header: cell text}."""
    head = [h.strip() for h in page.locator(f"#{table} tr").first.locator("th").all_inner_texts()]
    rows = page.locator(f"#{table} tr").all()[1:]
    return [dict(zip(head, r.locator("td").all_inner_texts(), strict=False)) for r in rows]


def shots(page: Page, name: str) -> None:
    if not SCREENSHOTS:
        return
    folder = REPO / SCREENSHOTS
    folder.mkdir(parents=True, exist_ok=True)
    for width, size in (("desktop", DESKTOP), ("narrow", NARROW)):
        page.set_viewport_size(size)
        page.screenshot(path=str(folder / f"console-{name}-{width}.png"), full_page=True)
    page.set_viewport_size(DESKTOP)


# ------------------------------------------------------------------------------ tests


def test_the_jobs_list_shows_queue_scrubbed_arguments_and_why_a_job_waits(
    page: Page, seeded: dict[str, uuid.UUID]
) -> None:
    log_in(page)
    page.goto("/admin/jobs?module=jobs")

    rows = {r["job_id"]: r for r in _cells(page, "jobs")}
    secret = rows[str(seeded["secret"])]
    assert "***" in secret["arguments"] or "*" in secret["arguments"]
    assert SECRET not in page.content()
    assert rows[str(seeded["queued"])]["queue"] == NOBODY_QUEUE
    assert f"no live worker consumes queue '{NOBODY_QUEUE}'" in rows[str(seeded["queued"])][
        "error / why waiting"]  # fmt: skip
    assert "dead in the outbox" in rows[str(seeded["dead"])]["error / why waiting"]
    assert rows[str(seeded["succeeded"])]["queue"] == "celery"
    shots(page, "jobs")

    page.goto(f"/admin/jobs?module=jobs&queue={NOBODY_QUEUE}")
    assert [r["job_id"] for r in _cells(page, "jobs")] == [str(seeded["queued"])]
    page.goto("/admin/jobs?q=" + SECRET)
    assert [r["job_id"] for r in _cells(page, "jobs")] == [str(seeded["secret"])]


def test_ticked_rows_are_cancelled_after_a_confirmation_each_audited(
    page: Page, db: Engine, seeded: dict[str, uuid.UUID]
) -> None:
    picked = [enqueue(db, tasks.echo, f"pick-{i}-{uuid.uuid4()}") for i in range(2)]
    log_in(page, name="dora")
    page.goto("/admin/jobs?module=jobs&task=tests.echo")
    for job_id in picked:
        page.check(f"input[name=job][value='jobs:{job_id}']")
    page.check(f"input[name=job][value='jobs:{seeded['succeeded']}']")  # not queued: left out

    page.click("button:has-text('Cancel selected')")
    assert "1 of the selected jobs is not queued" in page.inner_text("#skipped")
    assert {r["job_id"] for r in _cells(page, "jobs")} == {str(j) for j in picked}
    page.fill("#bulk input[name=reason]", "duplicates")
    shots(page, "bulk-cancel")
    page.click("#bulk button")

    assert page.inner_text("h1") == "Cancelled 2 of 2"
    for job_id in picked:
        assert _state(db, job_id) == "failed"
        assert operator_events(db, job_id) == [("cancel", "operator:dora", "duplicates")]


def test_a_job_page_shows_each_traceback_once_folded_and_the_celery_task_ids(
    page: Page, seeded: dict[str, uuid.UUID]
) -> None:
    from jobsapp.lifecycle.message import task_id_for

    log_in(page)
    page.goto(f"/admin/jobs/jobs/{seeded['failed']}")

    assert page.locator("details.traceback").count() == 1
    assert not page.locator("details.traceback").get_attribute("open")
    assert "PermanentError" in page.inner_text("details.traceback summary")
    assert task_id_for(seeded["failed"], 1) in page.inner_text("#attempts")
    assert page.locator("#timeline a[href='#attempt-1']").count() >= 1
    shots(page, "job")


def test_a_page_refreshes_in_place_until_paused(
    page: Page, db: Engine, seeded: dict[str, uuid.UUID]
) -> None:
    polls: list[Request] = []
    page.on("request", lambda r: polls.append(r) if r.headers.get("x-jobsapp-live") else None)
    log_in(page)
    page.goto("/admin/jobs?module=jobs&state=queued")
    page.evaluate("window.sameDocument = true")

    newcomer = enqueue(db, tasks.echo, f"live-{uuid.uuid4()}")
    page.wait_for_selector(f"text={newcomer}", timeout=30_000)
    assert page.evaluate("window.sameDocument") is True

    page.click("#live")
    assert page.inner_text("#live") == "Resume live updates"
    asked = len(polls)
    later = enqueue(db, tasks.echo, f"paused-{uuid.uuid4()}")
    page.wait_for_timeout(12_000)  # two polling periods and more: none may be sent
    assert len(polls) == asked
    assert str(later) not in page.inner_text("#jobs")
    page.locator("#live").focus()  # by keyboard: a real button, in the tab order
    page.keyboard.press("Enter")
    assert page.inner_text("#live") == "Pause live updates"
    page.wait_for_selector(f"text={later}", timeout=30_000)


def test_the_queues_page_matches_the_journal_and_the_broker(
    page: Page, db: Engine, seeded: dict[str, uuid.UUID]
) -> None:
    log_in(page)
    page.goto("/admin/queues")

    rows = {(r["queue"], r["module"]): r for r in _cells(page, "queues")}
    nobody = rows[(NOBODY_QUEUE, "jobs")]
    due = _scalar(db, "SELECT count(*) FROM job_runs WHERE state = 'queued' AND queue = :q "
                  "AND (next_retry_at IS NULL OR next_retry_at <= now())",
                  q=NOBODY_QUEUE)  # fmt: skip
    assert int(nobody["queued, due"]) == due
    assert nobody["live workers consuming"] == "0"
    celery = rows[("celery", "jobs")]
    later = _scalar(db, "SELECT count(*) FROM job_runs WHERE state = 'queued' "
                    "AND queue IS NULL AND next_retry_at > now()")  # fmt: skip
    assert int(celery["queued for later"]) == later
    assert celery["live workers consuming"] == "1"
    assert _cells(page, "broker")[0]["messages"].strip().isdigit()
    shots(page, "queues")


def test_the_workers_page_shows_the_worker_and_what_it_runs(
    page: Page, db: Engine, seeded: dict[str, uuid.UUID]
) -> None:
    log_in(page)
    _wait(lambda: _scalar(db, "SELECT count(*) FROM workers") >= 1, "the worker never beat")
    page.goto("/admin/workers")

    (row,) = [r for r in _cells(page, "workers") if r["status"] == "alive"]
    holder = _scalar(db, "SELECT worker FROM job_runs WHERE job_id = :j", j=seeded["running"])
    assert holder.startswith(row["node"] + ":")
    assert (row["pool"], row["concurrency"], row["queues"]) == ("thread", "2", "celery")
    assert str(seeded["running"]) in row["running now"]
    shots(page, "workers")


def test_the_scheduled_page_lists_a_snoozed_job_and_runs_it_now(
    page: Page, db: Engine, worker: Path, seeded: dict[str, uuid.UUID]
) -> None:
    log_in(page, name="ed")
    page.goto("/admin/scheduled")
    waiting = _scalar(db, "SELECT count(*) FROM job_runs WHERE state = 'queued' "
                      "AND next_retry_at > now()")  # fmt: skip
    assert page.inner_text("#total").startswith(f"{waiting} queued job")
    row = page.locator("#scheduled tr", has_text=str(seeded["scheduled"]))
    shots(page, "scheduled")

    row.locator("input[name=reason]").fill("upstream is back")
    row.locator("button").click()

    assert "Due now" in page.inner_text(".flash.ok")
    wait_state(db, seeded["scheduled"], "succeeded", worker)
    events = operator_events(db, seeded["scheduled"])
    assert ("run_now", "operator:ed", "upstream is back") in events


def test_the_charts_count_what_the_journal_holds(
    page: Page, db: Engine, seeded: dict[str, uuid.UUID]
) -> None:
    log_in(page)
    page.goto("/admin/charts?window=day")

    outcomes = {r["outcome"]: int(r["in the last day"]) for r in _cells(page, "outcomes")}
    failed = _scalar(db, "SELECT count(*) FROM job_events WHERE transition = 'fail' "
                     "AND at > now() - interval '1 day'")  # fmt: skip
    assert outcomes["failed"] >= failed >= 1
    assert page.locator("#throughput rect").count() >= 1
    assert "PermanentError" in page.inner_text("#failures")
    shots(page, "charts")


@pytest.mark.parametrize("size", [DESKTOP, NARROW], ids=["desktop", "narrow"])
def test_every_page_passes_axe(
    browser: Browser, http: Http, seeded: dict[str, uuid.UUID], size: dict[str, int]
) -> None:
    from axe_playwright_python.sync_playwright import Axe

    context = browser.new_context(base_url=http.base_url, viewport=size)  # type: ignore[arg-type]
    page = context.new_page()
    log_in(page)
    found = {}
    paths = ["/admin", "/admin/jobs", f"/admin/jobs/jobs/{seeded['failed']}", "/admin/queues",
             "/admin/workers", "/admin/scheduled", "/admin/charts"]  # fmt: skip
    try:
        for path in paths:
            page.goto(path)
            results = Axe().run(page)
            found[path] = [(v["id"], [n["target"] for n in v["nodes"]][:3])
                           for v in results.response["violations"]]  # fmt: skip
            if path == "/admin":
                shots(page, "overview")
    finally:
        context.close()

    assert found == {path: [] for path in paths}, found
