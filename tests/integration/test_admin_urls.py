"""Console URLs a person types: ``/admin/`` with its slash is the overview, and an
``/admin/...`` path with no page answers the console's own 404 page, not the API's JSON
(issue 36); the API keeps its JSON 404."""

from __future__ import annotations

import re
import uuid

from sqlalchemy import Engine

from jobsapp.lifecycle import journal
from jobsapp.web.app import create_app
from tests.support import tasks
from tests.support.attachments import environment


def test_admin_urls_answer_pages_and_the_api_keeps_json(db: Engine) -> None:
    with environment(JOBSAPP_ADMIN_TOKEN="a-token-long-enough-for-the-console-1234"):
        client = create_app().test_client()
        slash = client.get("/admin/")
        missing = client.get("/admin/workflows")
        api = client.get("/v1/admin/nope")

    assert (slash.status_code, slash.headers["Location"]) == (308, "/admin")
    assert missing.status_code == 404
    assert missing.mimetype == "text/html"
    assert "No page at /admin/workflows" in missing.get_data(as_text=True)
    assert (api.status_code, api.mimetype) == (404, "application/json")


def test_a_console_page_that_finds_nothing_answers_its_404_not_a_redirect_to_itself(
    db: Engine,
) -> None:
    token = "a-token-long-enough-for-the-console-1234"
    unknown = f"/admin/attachments/{uuid.uuid4()}/variants/thumbnail"
    with environment(JOBSAPP_ADMIN_TOKEN=token):
        client = create_app().test_client()
        page = client.get(unknown, headers={"Authorization": f"Bearer {token}"})
        slash = client.get(unknown + "/", headers={"Authorization": f"Bearer {token}"})

    assert (page.status_code, page.mimetype) == (404, "text/html")
    assert "no such variant" in page.get_data(as_text=True)
    assert (slash.status_code, slash.headers["Location"]) == (308, unknown)


def test_the_throughput_chart_has_a_time_axis(db: Engine) -> None:
    token = "a-token-long-enough-for-the-console-1234"
    with environment(JOBSAPP_ADMIN_TOKEN=token):
        client = create_app().test_client()
        page = client.get("/admin/charts?window=hour", headers={"Authorization": f"Bearer {token}"})

    assert page.status_code == 200, page.get_data(as_text=True)[:500]
    axis = page.get_data(as_text=True).split('<g class="time-axis">', 1)[1].split("</g>", 1)[0]
    assert len(re.findall(r">\d\d:\d\d</text>", axis)) >= 5


def test_the_charts_split_the_window_by_task(db: Engine) -> None:
    with db.begin() as conn:
        for task, n in ((tasks.echo, 2), (tasks.doomed, 1)):
            for i in range(n):
                journal.enqueue(conn, task.new_job((f"split-{i}",), {}, uuid.uuid4()), actor="test")
    token = "a-token-long-enough-for-the-console-1234"
    with environment(JOBSAPP_ADMIN_TOKEN=token):
        client = create_app().test_client()
        page = client.get("/admin/charts?window=hour", headers={"Authorization": f"Bearer {token}"})

    table = page.get_data(as_text=True).split('<table id="by-task">', 1)[1].split("</table>", 1)[0]
    rows = {
        cells[1]: cells[2:]
        for cells in (
            re.findall(r"<td[^>]*>(?:<a[^>]*>)?([^<]*)", tr) for tr in table.split("<tr>")[2:]
        )
    }
    # queued, running, succeeded, failed
    assert rows["tests.echo"] == ["2", "0", "0", "0"]
    assert rows["tests.doomed"] == ["1", "0", "0", "0"]
