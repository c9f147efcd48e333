"""A successful job grows the journal by its run row and its outbox row only (issue 21),
while its timeline and the metrics still show its enqueue, claim and success.

The run row carries the happy path (journal/row_events.py); these tests count what a
user would: the rows of every journal table, the admin timeline, the rollup's totals.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine, func, select

from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.lifecycle.rules.states import Transition
from jobsapp.monitor import browse, rollup
from tests.support import tasks
from tests.support.migrations import sqlite_then_postgres

JOURNAL = (journal.EVENTS, journal.OUTBOX, *(spec.table for spec in registry.all_tables()))
HAPPY = [Transition.ENQUEUE.value, Transition.CLAIM.value, Transition.SUCCEED.value]


def _counts(db: Engine) -> dict[str, int]:
    with db.connect() as conn:
        return {
            t.name: conn.execute(select(func.count()).select_from(t)).scalar_one() for t in JOURNAL
        }


def test_a_successful_job_writes_a_run_row_and_an_outbox_row_and_its_timeline_is_whole(
    worker: object, db: Engine
) -> None:
    before = _counts(db)
    handle = tasks.echo.apply_async(("two rows",))
    handle.settled()
    grown = {name: n - before[name] for name, n in _counts(db).items() if n != before[name]}

    assert grown == {"job_runs": 1, "outbox": 1}
    detail = browse.job_detail(db, JOBS.module, handle.job_id)
    assert detail is not None
    assert [e.transition for e in detail.events] == HAPPY
    enqueue, claim, succeed = detail.events
    assert enqueue.actor == "producer"
    assert claim.actor == succeed.actor == detail.run.worker
    assert enqueue.at <= claim.at <= succeed.at == detail.run.finished_at
    (attempt,) = detail.attempts
    assert (attempt.number, attempt.outcome, attempt.worker) == (1, "succeeded", claim.actor)


def test_a_retried_job_keeps_its_first_claim_as_an_event_row(worker: object, db: Engine) -> None:
    handle = tasks.flaky.apply_async((f"rows-flaky-{uuid.uuid4()}", 1, "hunter2"))
    handle.settled()

    detail = browse.job_detail(db, JOBS.module, handle.job_id)
    assert detail is not None
    assert [(e.transition, e.attempt) for e in detail.events] == [
        ("enqueue", 1),
        ("claim", 1),
        ("retry", 1),
        ("claim", 2),
        ("succeed", 2),
    ]
    assert [a.outcome for a in detail.attempts] == ["failed, retry planned", "succeeded"]
    with db.connect() as conn:
        rows = (
            conn.execute(
                select(journal.EVENTS.c.transition)
                .where(journal.EVENTS.c.job_id == handle.job_id)
                .order_by(journal.EVENTS.c.id)
            )
            .scalars()
            .all()
        )
    assert rows == ["claim", "retry"]


def _succeeded_once(db: Engine, job_id: uuid.UUID, attempt: int, worker: str) -> None:
    with db.begin() as conn:
        row = journal.claim(conn, JOBS, job_id, attempt, worker=worker)
        assert row is not None
        assert journal.succeed(conn, JOBS, job_id, attempt, token=row.claimed_token, actor=worker)


def _totals(db: Engine) -> dict[str, int]:
    with db.connect() as conn:
        got = rollup.read(conn)
    mine = {k: v for k, v in got.items() if k[2] == tasks.echo.name}
    return {
        "succeeded": mine.get((rollup.ATTEMPTS, JOBS.module, tasks.echo.name, "succeeded"), 0),
        "durations": sum(
            v
            for (m, _, _, label), v in mine.items()
            if m == rollup.RUN_DURATION and label != rollup.SUM_MS
        ),
        "waits": sum(
            v
            for (m, _, _, label), v in mine.items()
            if m == rollup.QUEUE_WAIT and label != rollup.SUM_MS
        ),
    }


def _roll_all(db: Engine) -> dict[str, int]:
    while rollup.run_once(db, settle=timedelta(0)):
        pass
    return _totals(db)


def _rerun_counted(db: Engine, roll_between: bool) -> tuple[dict[str, int], list[str]]:
    """What the rollup adds for a job that succeeded, was enqueued again and succeeded."""
    before = _roll_all(db)
    job = tasks.echo.new_job(("counted once",), {}, None)
    _enqueue(db, job)
    _succeeded_once(db, job.job_id, 1, "w1")
    if roll_between:
        rollup.run_once(db, settle=timedelta(0))
    _enqueue(db, job)  # past its dedup window (none): a rerun
    _succeeded_once(db, job.job_id, 2, "w2")
    after = _roll_all(db)
    detail = browse.job_detail(db, JOBS.module, job.job_id)
    assert detail is not None
    return {k: after[k] - before[k] for k in after}, [e.transition for e in detail.events]


def _enqueue(db: Engine, job: journal.NewJob) -> None:
    with db.begin() as conn:
        result = journal.enqueue(conn, job, actor="producer")
    assert result.outcome is journal.EnqueueOutcome.ENQUEUED


def test_a_rerun_success_is_counted_once_whether_or_not_the_rollup_saw_its_row(
    db: Engine,
) -> None:
    for roll_between in (True, False):
        totals, timeline = _rerun_counted(db, roll_between)

        assert totals == {"succeeded": 2, "durations": 2, "waits": 2}, roll_between
        assert timeline == [*HAPPY, Transition.RERUN.value, "claim", "succeed"], roll_between


def test_migration_0015_goes_down_and_up_on_both_dialects(tmp_path: Path) -> None:
    sqlite_then_postgres(tmp_path, "rowfacts", "attempted_at", below="0014")
