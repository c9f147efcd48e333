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
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from playwright.sync_api import Browser, Page, Request
from sqlalchemy import Engine, func, literal, select, text, union_all

from jobsapp import operator
from jobsapp.attachments.models import ATTACHMENT_RUNS
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.rules.states import ALL_STATES, Transition
from jobsapp.monitor import summary
from jobsapp.web.ui import LIVE_EVERY_MS
from tests.e2e.browser import chromium
from tests.support import tasks
from tests.support.attachments import png
from tests.support.console_e2e import (
    SCREENSHOTS,
    deployment_engine,
    enqueue,
    log_in_page,
    operator_env,
    operator_events,
    wait_state,
)
from tests.support.env import SESSION
from tests.support.planted import claimed, failed_job, queued_attachment_job, rolled_up
from tests.support.servers import RedisServer
from tests.support.webserver import REPO, Http, running_web, running_worker

DATABASE = f"jobsapp_e2e_console_{SESSION}"
DESKTOP = {"width": 1280, "height": 900}
NARROW = {"width": 390, "height": 844}
# A credential in a job's arguments: the list must mask it, the search must find the job.
SECRET = "pw-" + uuid.uuid4().hex[:12]
SECRET_URL = f"postgresql://app:{SECRET}@db.internal/jobs"
NOBODY_QUEUE = "nobody-consumes-this"
DOMAINS = ("jobs", "attachments")

pytestmark = pytest.mark.timeout(240)


# --------------------------------------------------------------------------- services


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory, module_redis: RedisServer
) -> Iterator[dict[str, str]]:
    with operator_env(tmp_path_factory, DATABASE, module_redis) as found:
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
    with deployment_engine(env) as engine:
        yield engine


@pytest.fixture(scope="module")
def broker(env: dict[str, str]) -> Celery:
    return Celery("e2e-console-producer", broker=env["JOBSAPP_BROKER_URL"])


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as found:
        yield found


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
    """Jobs in every state on two domains: generic jobs through the worker, attachment runs
    planted in the journal beside one upload the worker processes (a failing, a slow or a
    retrying pipeline would cost minutes; the pages read the journal the same way)."""
    jobs = {
        "succeeded": enqueue(db, tasks.echo, f"ok-{uuid.uuid4()}", publish=broker),
        "failed": enqueue(db, tasks.fails_once, f"bad-{uuid.uuid4()}", publish=broker),
        "running": enqueue(db, tasks.sleepy, f"slow-{uuid.uuid4()}", 900.0, publish=broker),
        "scheduled": enqueue(db, tasks.paused, f"later-{uuid.uuid4()}", 3600.0, publish=broker),
        "secret": enqueue(db, tasks.flaky, f"args-{uuid.uuid4()}", 0, SECRET_URL),
        "queued": enqueue(db, tasks.echo, f"waits-{uuid.uuid4()}"),
        "dead": enqueue(db, tasks.echo, f"dead-{uuid.uuid4()}"),
        "cancelled": enqueue(db, tasks.echo, f"dropped-{uuid.uuid4()}"),
    }
    with db.begin() as conn:
        conn.execute(
            text(
                "UPDATE outbox SET dead_at = now(), publish_failures = 5, "
                "last_error = 'no worker takes it' WHERE job_id = :j"
            ),
            {"j": jobs["dead"]},
        )
        conn.execute(
            text("UPDATE job_runs SET queue = :q WHERE job_id = :j"),
            {"q": NOBODY_QUEUE, "j": jobs["queued"]},
        )
    operator.cancel(db, "jobs", jobs["cancelled"], actor="seed", reason="a duplicate")
    upload = http.post_file(png(), "cat.png", "image/png")
    assert upload.status == 202, upload.body
    attachments = _attachment_runs(db)
    for name in ("succeeded", "failed"):
        wait_state(db, jobs[name], name, worker)
    _wait(lambda: _state(db, jobs["running"]) == "running", "sleepy never ran")
    _wait(lambda: _next_retry(db, jobs["scheduled"]) is not None, "paused never snoozed")
    _wait(lambda: _count(db, "attachment_runs", "succeeded") >= 1, "the upload never ran")
    return jobs | {f"attachment-{name}": job_id for name, job_id in attachments.items()}


def _attachment_runs(db: Engine) -> dict[str, uuid.UUID]:
    """Attachment runs queued (unpublished: no beat runs here), running (a worker that is
    not this test's), failed, cancelled and waiting for a retry an hour away."""
    runs = {
        name: queued_attachment_job(db) for name in ("queued", "running", "cancelled", "scheduled")
    }
    claimed(db, ATTACHMENT_RUNS, runs["running"])
    runs["failed"] = failed_job(db, ATTACHMENT_RUNS, queued_attachment_job(db))
    operator.cancel(db, "attachments", runs["cancelled"], actor="seed", reason="wrong file")
    with db.begin() as conn:
        run = journal.claim(conn, ATTACHMENT_RUNS, runs["scheduled"], 1, worker="w1@host")
        assert run is not None
        journal.requeue(
            conn,
            ATTACHMENT_RUNS,
            run,
            error="storage_unavailable",
            transition=Transition.RETRY,
            actor="w1@host",
            delay=timedelta(hours=1),
        )
    return runs


def _journal(db: Engine) -> list[dict[str, Any]]:
    """Every run of every domain, as the pages should show it."""
    parts = [
        select(
            literal(spec.module).label("module"),
            t.c.job_id,
            t.c.state,
            t.c.outcome,
            t.c.queue,
            func.coalesce(t.c.next_retry_at > func.now(), False).label("later"),
        )
        for spec in registry.all_tables()
        for t in (spec.table,)
    ]
    with db.connect() as conn:
        return [dict(r) for r in conn.execute(union_all(*parts)).mappings()]


def _agree(shown: Callable[[], Any], held: Callable[[], Any], what: str) -> None:
    """Poll until the page shows what the journal holds (a worker may move a job between
    the two reads); on the deadline, fail with both."""
    deadline = time.monotonic() + 30
    while True:
        seen, expected = shown(), held()
        if seen == expected:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: the page shows {seen}, the journal {expected}")
        time.sleep(0.5)


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
    return _scalar(
        db,
        "SELECT next_retry_at FROM job_runs WHERE job_id = :j AND state = "
        "'queued' AND next_retry_at > now()",
        j=job_id,
    )


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


def test_the_journal_holds_every_state_on_two_domains(
    db: Engine, seeded: dict[str, uuid.UUID]
) -> None:
    held = Counter((r["module"], r["state"], r["outcome"]) for r in _journal(db))
    for module in DOMAINS:
        assert all(
            held[(module, s, o)]
            for s, o in (
                ("queued", None),
                ("running", None),
                ("succeeded", "succeeded"),
                ("failed", "permanent"),
                ("failed", "cancelled"),
            )
        ), held
    later = {(r["module"], r["state"]) for r in _journal(db) if r["later"]}
    assert later >= {("jobs", "queued"), ("attachments", "queued")}


def test_the_overview_counts_each_state_of_each_domain_as_the_journal(
    page: Page, db: Engine, seeded: dict[str, uuid.UUID]
) -> None:
    log_in_page(page)

    def shown() -> dict[str, dict[str, int]]:
        rolled_up(db)  # finished runs count once beat's rollup saw them (no beat runs here)
        page.goto("/admin")
        return {r["module"]: {s: int(r[s]) for s in ALL_STATES} for r in _cells(page, "counts")}

    def held() -> dict[str, dict[str, int]]:
        rows = _journal(db)
        return {
            spec.module: {
                s: sum(1 for r in rows if (r["module"], r["state"]) == (spec.module, s))
                for s in ALL_STATES
            }
            for spec in registry.all_tables()
        }

    _agree(shown, held, "overview counts")


def _selected(row: Mapping[str, Any], name: str) -> bool:
    """What a state filter means to an operator: ``failed`` leaves out the cancelled and
    expired runs, which ``cancelled`` and ``expired`` list."""
    if name in summary.NOT_FAILURES:
        return row["state"] == "failed" and row["outcome"] == name
    if name == "failed":
        return row["state"] == "failed" and row["outcome"] not in summary.NOT_FAILURES
    return bool(row["state"] == name)


@pytest.mark.parametrize("module", DOMAINS)
def test_the_jobs_list_of_each_domain_and_state_is_the_journal(
    page: Page, db: Engine, seeded: dict[str, uuid.UUID], module: str
) -> None:
    log_in_page(page)

    def listed(query: str) -> Callable[[], dict[str, tuple[str, str]]]:
        def read() -> dict[str, tuple[str, str]]:
            page.goto(f"/admin/jobs?module={module}{query}")
            return {
                r["job_id"]: (r["state"], r["outcome"])
                for r in _cells(page, "jobs")
                if r.get("module") == module
            }

        return read

    def held(state: str | None = None) -> Callable[[], dict[str, tuple[str, str]]]:
        return lambda: {
            str(r["job_id"]): (r["state"], r["outcome"] or "")
            for r in _journal(db)
            if r["module"] == module and (state is None or _selected(r, state))
        }

    _agree(listed(""), held(), f"{module} jobs")
    for state in summary.FILTERS:
        _agree(listed(f"&state={state}"), held(state), f"{module} {state} jobs")
        assert page.inner_text("#total").startswith(f"{len(held(state)())} matching")


def test_the_jobs_list_shows_queue_scrubbed_arguments_and_why_a_job_waits(
    page: Page, seeded: dict[str, uuid.UUID]
) -> None:
    log_in_page(page)
    page.goto("/admin/jobs?module=jobs")

    rows = {r["job_id"]: r for r in _cells(page, "jobs")}
    secret = rows[str(seeded["secret"])]
    assert "***" in secret["arguments"] or "*" in secret["arguments"]
    assert SECRET not in page.content()
    assert rows[str(seeded["queued"])]["queue"] == NOBODY_QUEUE
    assert (
        f"no live worker consumes queue '{NOBODY_QUEUE}'"
        in rows[str(seeded["queued"])]["error / why waiting"]
    )
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
    log_in_page(page, name="dora")
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
    from jobsapp.lifecycle.rules.message import task_id_for

    log_in_page(page)
    page.goto(f"/admin/jobs/jobs/{seeded['failed']}")

    assert page.locator("details.traceback").count() == 1
    assert not page.locator("details.traceback").get_attribute("open")
    assert "PermanentError" in page.inner_text("details.traceback summary")
    assert task_id_for(seeded["failed"], 1) in page.inner_text("#attempts")
    assert page.locator("#timeline a[href='#attempt-1']").count() >= 1
    shots(page, "job")


def test_the_job_page_of_each_attachment_run_is_its_journal_row(
    page: Page, db: Engine, seeded: dict[str, uuid.UUID]
) -> None:
    log_in_page(page)
    runs = {
        k.removeprefix("attachment-"): v for k, v in seeded.items() if k.startswith("attachment-")
    }
    rows = {r["job_id"]: r for r in _journal(db) if r["module"] == "attachments"}
    for name, job_id in runs.items():
        page.goto(f"/admin/jobs/attachments/{job_id}")
        terms = page.locator("#run dt").all_inner_texts()
        shown = dict(zip(terms, page.locator("#run dd").all_inner_texts(), strict=True))
        row = rows[job_id]
        assert (shown["state"], shown["outcome"]) == (row["state"], row["outcome"] or ""), name


def test_a_page_refreshes_in_place_until_paused(
    page: Page, db: Engine, seeded: dict[str, uuid.UUID]
) -> None:
    polls: list[Request] = []
    page.on("request", lambda r: polls.append(r) if r.headers.get("x-jobsapp-live") else None)
    # The page's timers run on a clock the test moves: a polling period passes at once, not
    # in five real seconds (between moves its time still flows as usual).
    page.clock.install()
    log_in_page(page)
    page.goto("/admin/jobs?module=jobs&state=queued")
    page.evaluate("window.sameDocument = true")

    newcomer = enqueue(db, tasks.echo, f"live-{uuid.uuid4()}")
    page.clock.run_for(LIVE_EVERY_MS)
    page.wait_for_selector(f"text={newcomer}", timeout=30_000)
    assert page.evaluate("window.sameDocument") is True

    page.click("#live")
    assert page.inner_text("#live") == "Resume live updates"
    asked = len(polls)
    later = enqueue(db, tasks.echo, f"paused-{uuid.uuid4()}")
    page.clock.run_for(2 * LIVE_EVERY_MS + 2_000)  # two polling periods and more: none may be sent
    page.wait_for_timeout(500)  # a request a tick would have sent has left the page by now
    assert len(polls) == asked
    assert str(later) not in page.inner_text("#jobs")
    page.locator("#live").focus()  # by keyboard: a real button, in the tab order
    page.keyboard.press("Enter")
    assert page.inner_text("#live") == "Pause live updates"
    page.wait_for_selector(f"text={later}", timeout=30_000)


def test_the_queues_page_matches_the_journal_and_the_broker(
    page: Page, db: Engine, seeded: dict[str, uuid.UUID]
) -> None:
    log_in_page(page)

    def shown() -> dict[tuple[str, str], tuple[int, int]]:
        page.goto("/admin/queues")
        rows = {
            (r["queue"], r["module"]): (int(r["queued, due"]), int(r["queued for later"]))
            for r in _cells(page, "queues")
        }
        # A domain that claimed lately is listed with nothing queued.
        return {key: depth for key, depth in rows.items() if depth != (0, 0)}

    def held() -> dict[tuple[str, str], tuple[int, int]]:
        queued = [r for r in _journal(db) if r["state"] == "queued"]
        keys = Counter((r["queue"] or "celery", r["module"], bool(r["later"])) for r in queued)
        return {(q, m): (keys[(q, m, False)], keys[(q, m, True)]) for q, m, _ in keys}

    _agree(shown, held, "queue depths")
    assert {m for _, m in held()} == set(DOMAINS)
    rows = {(r["queue"], r["module"]): r for r in _cells(page, "queues")}
    assert rows[(NOBODY_QUEUE, "jobs")]["live workers consuming"] == "0"
    assert rows[("celery", "jobs")]["live workers consuming"] == "1"
    assert rows[("celery", "attachments")]["live workers consuming"] == "1"
    assert _cells(page, "broker")[0]["messages"].strip().isdigit()
    shots(page, "queues")


def test_the_workers_page_shows_the_worker_and_what_it_runs(
    page: Page, db: Engine, seeded: dict[str, uuid.UUID]
) -> None:
    log_in_page(page)
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
    log_in_page(page, name="ed")
    page.goto("/admin/scheduled")
    waiting = Counter(r["module"] for r in _journal(db) if r["later"])
    assert page.inner_text("#total").startswith(f"{waiting.total()} queued job")
    assert Counter(r["module"] for r in _cells(page, "scheduled")) == waiting
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
    log_in_page(page)
    rolled_up(db)  # the attempts ended are the series beat's rollup keeps (no beat runs here)
    page.goto("/admin/charts?window=day")

    outcomes = {r["outcome"]: int(r["in the last day"]) for r in _cells(page, "outcomes")}
    failed = _scalar(
        db,
        "SELECT count(*) FROM job_events WHERE transition = 'fail' "
        "AND at > now() - interval '1 day'",
    )
    assert outcomes["failed"] >= failed >= 1
    assert page.locator("#throughput rect").count() >= 1
    assert "PermanentError" in page.inner_text("#failures")
    shots(page, "charts")


def test_a_dry_run_reconcile_names_why_each_failed_run_is_left_alone(
    page: Page, db: Engine, seeded: dict[str, uuid.UUID]
) -> None:
    from axe_playwright_python.sync_playwright import Axe

    log_in_page(page)
    page.goto("/admin")
    page.check("#reconcile input[name=dry_run]")
    page.click("#reconcile button")

    assert page.inner_text("h1") == "Reconcile pass (dry run)"
    shown = {(r["module"], r["job_id"]): r["rule"] for r in _cells(page, "held-back")}
    # No failure here carries a code its domain retakes: each is held back, a cancel as
    # no failure at all, the others for their error.
    held = {
        (r["module"], str(r["job_id"])): "not_a_failure"
        if r["outcome"] == "cancelled"
        else "not_retryable"
        for r in _journal(db)
        if r["state"] == "failed"
    }
    assert shown == held
    assert {m for m, _ in shown} >= set(DOMAINS)
    assert Axe().run(page).response["violations"] == []
    shots(page, "reconcile")


@pytest.mark.parametrize("size", [DESKTOP, NARROW], ids=["desktop", "narrow"])
def test_every_page_passes_axe(
    browser: Browser, http: Http, seeded: dict[str, uuid.UUID], size: dict[str, int]
) -> None:
    from axe_playwright_python.sync_playwright import Axe

    context = browser.new_context(base_url=http.base_url, viewport=size)  # type: ignore[arg-type]
    page = context.new_page()
    log_in_page(page)
    found = {}
    paths = [
        "/admin",
        "/admin/jobs",
        f"/admin/jobs/jobs/{seeded['failed']}",
        f"/admin/jobs/attachments/{seeded['attachment-failed']}",
        "/admin/queues",
        "/admin/workers",
        "/admin/scheduled",
        "/admin/charts",
    ]
    try:
        for path in paths:
            page.goto(path)
            results = Axe().run(page)
            found[path] = [
                (v["id"], [n["target"] for n in v["nodes"]][:3])
                for v in results.response["violations"]
            ]
            if path == "/admin":
                shots(page, "overview")
    finally:
        context.close()

    assert found == {path: [] for path in paths}, found
