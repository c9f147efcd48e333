"""Periodic lifecycle entries against the journal: a restarted beat offers its slots again
and the journal refuses each one, finished or not; the admin overview shows the entry's
last and next slot. On both dialects."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
import redis
from celery.beat import ScheduleEntry
from sqlalchemy import Engine, select

from jobsapp.celery_app import app
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.journal.tables import JobRun
from jobsapp.maintenance import lease, periodic, periodic_slots
from jobsapp.web.app import create_app
from tests.support import tasks
from tests.support.attachments import environment
from tests.support.env import service
from tests.support.journal_view import transitions

ENTRY = "tests-hourly-report"
HOURLY = {
    "task": "tests.echo",
    "schedule": timedelta(hours=1),
    "kwargs": {"token": "report"},
    "options": {"catch_up": True},
}
# Two hours: the beat's first tick offers the slots of the last two hours.
WINDOW = timedelta(hours=2)
TOKEN = "periodic-page-token-7f3a9c2e5b1d8064"
RUNS = JobRun.__table__


@pytest.fixture
def hourly() -> Iterator[periodic.PeriodicEntry]:
    """An hourly entry of tests.echo in the app's beat schedule, for this test only."""
    assert tasks.echo.name == HOURLY["task"]
    saved = app.conf.beat_schedule
    app.conf.beat_schedule = {**saved, ENTRY: HOURLY}
    entry = periodic.periodic_entry(app, ScheduleEntry(**dict(HOURLY, name=ENTRY, app=app)))
    assert entry is not None
    try:
        yield entry
    finally:
        app.conf.beat_schedule = saved


def database_now(db: Engine) -> datetime:
    with db.connect() as conn:
        return lease.database_now(conn)


def recent_slot_ids(db: Engine, span: timedelta) -> set[uuid.UUID]:
    """The job ids of the entry's slots due in the last ``span``."""
    due = periodic_slots.recent(
        periodic_slots.every(timedelta(hours=1)), now=database_now(db), span=span, limit=10
    )
    return {periodic_slots.slot_job_id(ENTRY, d) for d in due}


def run_ids(db: Engine) -> set[uuid.UUID]:
    with db.connect() as conn:
        return set(
            conn.execute(select(RUNS.c.job_id).where(RUNS.c.task_name == "tests.echo")).scalars()
        )


def finish(db: Engine, job_ids: set[uuid.UUID]) -> None:
    """What a worker does with each job: claim it, run it, succeed."""
    with db.begin() as conn:
        for job_id in job_ids:
            claimed = journal.claim(conn, registry.JOBS, job_id, 1, worker="w@host:1")
            assert claimed
            assert journal.succeed(
                conn, registry.JOBS, job_id, 1, actor="w@host:1", token=claimed.claimed_token
            )


def forget_fast_path(job_ids: set[uuid.UUID]) -> None:
    """Drop the Redis dedup keys, so the journal alone answers (as with Redis down)."""
    client = redis.Redis.from_url(service("JOBSAPP_TEST_REDIS_URL"))
    for job_id in job_ids:
        client.delete(*client.scan_iter(f"jobsapp:dedup:*{job_id}"), "absent")


def test_a_restarted_beat_offers_its_slots_again_and_none_runs_twice(
    db: Engine, redis_clean: None, hourly: periodic.PeriodicEntry
) -> None:
    periodic.Periodic(app, [hourly], WINDOW).run_due(db)
    enqueued = run_ids(db)
    # The two slots of the window (three hours back: an hour may have turned since).
    assert len(enqueued) == 2
    assert enqueued <= recent_slot_ids(db, WINDOW + timedelta(hours=1))
    finish(db, enqueued)
    forget_fast_path(enqueued)

    periodic.Periodic(app, [hourly], WINDOW).run_due(db)

    assert run_ids(db) >= enqueued
    for job_id in enqueued:
        assert transitions(db, job_id) == ["enqueue", "claim", "succeed"]


def test_the_overview_lists_a_periodic_entry_with_its_last_and_next_slot(
    db: Engine, redis_clean: None, hourly: periodic.PeriodicEntry
) -> None:
    every_hour = periodic_slots.every(timedelta(hours=1))
    for _ in range(2):  # once more if an hour turned meanwhile: it cannot turn twice
        before = database_now(db)
        periodic.Periodic(app, [hourly], WINDOW).run_due(db)
        with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
            client = create_app().test_client()
            page = client.get(
                "/admin",
                base_url="http://admin.local",
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
        if every_hour(before) == every_hour(database_now(db)):
            break
    html = page.get_data(as_text=True)
    upcoming = every_hour(before)
    last = upcoming - timedelta(hours=1)

    assert page.status_code == 200
    start = html.index('id="periodic"')
    table = html[start : html.index("</table>", start)]
    assert ENTRY in table
    assert "tests.echo" in table
    assert f"{last:%Y-%m-%d %H:%M:%S}Z" in table
    assert str(periodic_slots.slot_job_id(ENTRY, last)) in table
    assert f"{upcoming:%Y-%m-%d %H:%M:%S}Z" in table
    assert "reaper" not in table  # plain Celery entries are beat's own business


def test_without_catch_up_a_new_entry_runs_once_at_its_latest_slot(
    db: Engine, redis_clean: None
) -> None:
    """Celery's default: the first beat start with a new entry sends it once, not once per
    slot of the window (issue 36: a 30 s digest entry sent 10 mails at its first start)."""
    plain = {**HOURLY, "options": {}}
    entry = periodic.periodic_entry(app, ScheduleEntry(**dict(plain, name=ENTRY, app=app)))
    assert entry is not None

    periodic.Periodic(app, [entry], WINDOW).run_due(db)

    latest = periodic_slots.recent(
        periodic_slots.every(timedelta(hours=1)), now=database_now(db), span=WINDOW, limit=1
    )
    assert run_ids(db) == {periodic_slots.slot_job_id(ENTRY, latest[0])}
