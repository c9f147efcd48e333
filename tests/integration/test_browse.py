"""The admin UI's read queries on Postgres and SQLite: filters, keyset paging across run
tables, one job's history, and an attachment's current job."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import Engine, select

from jobsapp.attachments.models import RUNS
from jobsapp.db import utcnow
from jobsapp.lifecycle.rules.states import State
from jobsapp.monitor import browse
from jobsapp.monitor.browse import JobFilter
from tests.support.planted import (
    ERROR,
    failed_job,
    queued_attachment_job,
    queued_job,
    succeeded_job,
)


def ids(db: Engine, wanted: JobFilter) -> list[uuid.UUID]:
    return [row.job_id for row in browse.find_jobs(db, wanted).rows]


def attachment_of(db: Engine, job_id: uuid.UUID) -> uuid.UUID:
    with db.connect() as conn:
        stmt = select(RUNS.c.attachment_id).where(RUNS.c.job_id == job_id)
        found: uuid.UUID = conn.execute(stmt).scalar_one()
        return found


def test_each_filter_narrows_the_list(db: Engine) -> None:
    failed, done, old = failed_job(db), succeeded_job(db), queued_job(db, ago=7200)
    attachment_job = queued_attachment_job(db)
    attachment_id = attachment_of(db, attachment_job)

    assert ids(db, JobFilter(states=("failed",))) == [failed]
    assert ids(db, JobFilter(module="attachments")) == [attachment_job]
    assert set(ids(db, JobFilter(task="tests.doomed"))) == {failed, done, old}
    # A prefix finds every task under it (issue 36: exact names only); % is no wildcard.
    assert set(ids(db, JobFilter(task="tests.doo"))) == {failed, done, old}
    assert ids(db, JobFilter(task="tests.%")) == []
    assert ids(db, JobFilter(min_age=3600)) == [old]
    assert old not in ids(db, JobFilter(max_age=3600))
    assert ids(db, JobFilter(text="NEVER works")) == [failed]
    assert ids(db, JobFilter(text=str(done)[4:20])) == [done]
    assert ids(db, JobFilter(text="100%_")) == []
    assert ids(db, JobFilter(attachment_id=attachment_id)) == [attachment_job]


def test_pages_walk_every_run_table_newest_first_each_job_once(db: Engine) -> None:
    made = [queued_job(db) for _ in range(5)] + [queued_attachment_job(db) for _ in range(2)]
    seen: list[uuid.UUID] = []
    after = None
    totals = set()

    while True:
        page = browse.find_jobs(db, JobFilter(), after=after, limit=2)
        seen += [row.job_id for row in page.rows]
        totals.add(page.total)
        if page.next is None:
            break
        after = browse.parse_cursor(page.next.encode())

    assert sorted(seen) == sorted(made)
    assert seen[0] == made[-1]
    assert totals == {7}


def test_a_job_page_has_its_attempts_and_timeline(db: Engine) -> None:
    job_id = failed_job(db)

    detail = browse.job_detail(db, "jobs", job_id)

    assert detail is not None
    assert detail.run.state == State.FAILED.value
    assert [e.transition for e in detail.events] == ["enqueue", "claim", "fail"]
    (attempt,) = detail.attempts
    assert (attempt.number, attempt.worker, attempt.outcome) == (1, "w1@host", "failed")
    assert attempt.error == ERROR
    assert detail.attachment_id is None
    assert browse.job_detail(db, "jobs", uuid.uuid4()) is None


def test_an_attachment_names_its_newest_job(db: Engine) -> None:
    job_id = queued_attachment_job(db)
    attachment_id = attachment_of(db, job_id)

    found = browse.attachment_job(db, attachment_id)

    assert found == {
        "module": "attachments",
        "job_id": str(job_id),
        "attempt": 0,
        "state": "queued",
    }
    assert browse.attachment_job(db, uuid.uuid4()) is None
    detail = browse.job_detail(db, "attachments", job_id)
    assert detail is not None
    assert detail.attachment_id == attachment_id
    assert utcnow() - detail.run.created_at < timedelta(minutes=1)


def test_the_count_stops_at_its_cap(db: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(5):
        queued_job(db)
    monkeypatch.setattr(browse, "COUNT_CAP", 3)

    capped = browse.find_jobs(db, JobFilter(module="jobs"), limit=2)
    exact = browse.find_jobs(db, JobFilter(module="jobs"), limit=10)

    assert (capped.total, capped.exact, len(capped.rows)) == (3, False, 2)
    assert (len(exact.rows), exact.next) == (5, None)


def test_a_search_shares_its_rows_between_the_states(
    db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(browse, "SEARCH_ROWS", 4)
    for _ in range(6):
        failed_job(db)
    queued_job(db)
    search = JobFilter(module="jobs", states=("queued", "failed"), text="NEVER works")

    # The one queued job is read whole; the 3 rows it leaves go to the failures.
    assert browse.find_jobs(db, search).total == 3

    for _ in range(3):
        queued_job(db)
    # Two states of 4 rows and more: 2 of each are read, whatever they hold.
    assert browse.find_jobs(db, search).total == 2


def test_a_search_reads_the_newest_rows_but_finds_an_id_at_any_age(
    db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = failed_job(db)
    for _ in range(3):
        queued_job(db)
        failed_job(db)
    monkeypatch.setattr(browse, "SEARCH_ROWS", 2)
    failed = JobFilter(module="jobs", states=("failed",))

    by_error = browse.find_jobs(db, replace(failed, text="NEVER works"))
    by_id = browse.find_jobs(db, replace(failed, text=str(old)[:13].upper()))

    # The error text is looked for in the newest two failed jobs only, the id everywhere.
    assert (by_error.total, old in [r.job_id for r in by_error.rows]) == (2, False)
    assert ([r.job_id for r in by_id.rows], by_id.total) == ([old], 1)
    assert browse.find_jobs(db, replace(failed, text="no such words")).total == 0
