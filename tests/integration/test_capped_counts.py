"""A backlog larger than the live counts read (``summary.ACTIVE_CAP``, cut here to 3):
the overview, the queues page, the charts' runs by task and ``/metrics/cluster`` say
"at least", count the oldest rows and still show the oldest wait; below the cap they
count every queued run (issue 37).
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from jobsapp.celery_app import app
from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.monitor import charts, summary
from jobsapp.web.app import create_app
from tests.support import tasks
from tests.support.attachments import environment
from tests.support.web import sample, scrape

TOKEN = "capped-counts-token-5e1b7d9c3a2f4860"
CAP = 3


def _queued(db: Engine, n: int) -> None:
    """``n`` echo jobs queued a minute apart, the first ``n`` minutes ago."""
    start = utcnow() - timedelta(minutes=n)
    with db.begin() as conn:
        for i in range(n):
            job = tasks.echo.new_job((f"backlog-{i}",), {}, None)
            journal.enqueue(conn, job, now=start + timedelta(minutes=i), actor="producer")


def _page(path: str) -> str:
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        reply = create_app().test_client().get(path, headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == 200, reply.get_data(as_text=True)[:300]
    return reply.get_data(as_text=True)


def _jobs_row(page: str) -> str:
    row = re.search(r"<tr><td>jobs</td>(.*?)</tr>", page, re.S)
    assert row is not None
    return re.sub(r"<[^>]+>", " ", row.group(1))


@pytest.fixture
def capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(summary, "ACTIVE_CAP", CAP)


@pytest.mark.usefixtures("capped")
def test_a_backlog_above_the_cap_reads_as_at_least_the_cap_with_its_oldest_wait(
    db: Engine,
) -> None:
    _queued(db, 5)

    overview = _page("/admin")
    queues = _page("/admin/queues")
    got = scrape()

    assert re.search(r'class="queued" href="[^"]*module=jobs[^"]*">3\+</a>', overview)
    assert 'id="capped"' in overview
    assert 'id="capped"' in queues
    assert ">3+</td>" in queues
    assert "5m0" in _jobs_row(overview)  # the oldest queued job has waited 5 minutes
    labels = {"module": "jobs", "state": "queued"}
    assert sample(got, "jobsapp_jobs_capped", **labels) == 1
    assert sample(got, "jobsapp_jobs_capped", module="jobs", state="running") == 0
    queued = {"module": "jobs", "task": "tests.echo", "queue": app.conf.task_default_queue}
    assert sample(got, "jobsapp_jobs", **queued, state="queued") == CAP
    assert sample(got, "jobsapp_oldest_queued_seconds", **queued) >= 5 * 60 - 1
    (line,) = [t for t in charts.charts(db, "hour").by_task if t.task == "tests.echo"]
    assert (line.states["queued"], line.capped) == (CAP, {"queued"})


@pytest.mark.usefixtures("capped")
def test_a_backlog_below_the_cap_is_counted_whole(db: Engine) -> None:
    _queued(db, 2)

    overview = _page("/admin")
    got = scrape()

    assert "+" not in _jobs_row(overview)
    assert 'id="capped"' not in overview
    assert 'id="capped"' not in _page("/admin/queues")
    queued = {"module": "jobs", "task": "tests.echo", "queue": app.conf.task_default_queue}
    assert sample(got, "jobsapp_jobs", **queued, state="queued") == 2
    assert sample(got, "jobsapp_jobs_capped", module="jobs", state="queued") == 0
