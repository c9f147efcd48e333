"""The batch path (``enqueue.transaction``): a few multi-row statements, one-by-one answers.

A batch must answer every job as the same enqueues made one by one, in order, in one
transaction would (new, duplicate job_id, busy concurrency key, the same within the
batch itself, a rerun of a finished job), leave the same rows behind, publish only after
COMMIT, and leave a crash between COMMIT and publish to the relay.
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import Connection, Engine, event, select, text

from jobsapp.celery_app import app
from jobsapp.db import utcnow
from jobsapp.lifecycle import EnqueueOutcome, journal
from jobsapp.lifecycle.journal import EVENTS, OUTBOX, EnqueueResult, NewJob
from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.lifecycle.producer.enqueue import transaction
from jobsapp.lifecycle.transport import outbox
from jobsapp.maintenance import relay
from tests.support import tasks
from tests.support.env import service
from tests.support.journal_view import held_by, outbox_rows, run_count, run_row
from tests.support.procs import Launcher
from tests.support.waiting import eventually, waiting_for_a_lock
from tests.support.workers import in_process_worker

RUNS = JOBS.table


def _keyed(account: str, job_id: uuid.UUID | None = None) -> NewJob:
    return tasks.keyed.new_job((), {"account": account, "token": account}, job_id or uuid.uuid4())


def _finished(conn: Connection, job: NewJob) -> None:
    journal.enqueue(conn, job, actor="test")
    assert journal.claim(conn, JOBS, job.job_id, 1, worker="w:1")
    assert journal.succeed(
        conn, JOBS, job.job_id, 1, token=held_by(conn, JOBS, job.job_id), actor="w:1"
    )


def _scenario() -> tuple[Callable[[Connection], None], list[NewJob]]:
    """Rows already there (an active job holding ``busy``), then a batch mixing every case."""
    active, twin = _keyed("busy"), uuid.uuid4()
    jobs = [
        _keyed("a"),  # new
        _keyed("busy"),  # key held by a run from before the batch: skipped
        _keyed("other", active.job_id),  # job_id taken before the batch: duplicate
        _keyed("b", twin),  # new ...
        _keyed("b", twin),  # ... and again in the same batch: duplicate
        _keyed("c"),  # new ...
        _keyed("c"),  # ... and its key taken earlier in the same batch: skipped
        _keyed("d"),  # new
    ]

    def before(conn: Connection) -> None:
        journal.enqueue(conn, active, actor="test")

    return before, jobs


def _with_rerun() -> tuple[Callable[[Connection], None], list[NewJob]]:
    """A finished job enqueued again takes its key at its turn, ahead of a later new job."""
    done = _keyed("r")  # tests.keyed has no dedup window: enqueued again, it runs again
    jobs = [_keyed("x"), done, _keyed("r"), _keyed("x")]

    def before(conn: Connection) -> None:
        _finished(conn, done)

    return before, jobs


# What a producer may put in a column: quotes, backslashes, braces and commas (an array
# literal's own syntax), the word NULL, a newline, text beyond ASCII.
# An eta: a due time of its own, not counted from the enqueue's clock.
ETA = utcnow() + timedelta(days=1)
AWKWARD = ['say "hi"', "back\\slash \\", "{a,b}", "NULL", "line\nbreak", "ünï €"]


def _varied() -> tuple[Callable[[Connection], None], list[NewJob]]:
    """Jobs with every option a run row and its first message carry: awkward arguments, a
    countdown, an eta, a queue, a priority, time limits, an expiry, a trace context."""
    options: list[dict[str, Any]] = [
        {"delay": timedelta(seconds=90, microseconds=250)},
        {"not_before": ETA},
        {"queue": "elsewhere", "priority": 7},
        {"time_limit": 30.5, "soft_time_limit": 20.0},
        {"expires_at": ETA},
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    ]
    jobs = [
        replace(tasks.echo.new_job((text,), {}, uuid.uuid4()), **option)
        for text, option in zip(AWKWARD, options, strict=True)
    ]
    return lambda _conn: None, jobs


def _answers(results: Sequence[EnqueueResult]) -> list[tuple[Any, ...]]:
    return [
        (r.outcome, r.job_id, r.holder, r.message and (r.message.job_id, r.message.attempt))
        for r in results
    ]


def _rows(conn: Connection) -> dict[str, list[tuple[Any, ...]]]:
    """What a user sees of the journal, minus ids and clock readings."""
    runs = conn.execute(
        select(
            RUNS.c.job_id,
            RUNS.c.state,
            RUNS.c.concurrency_key,
            RUNS.c.attempts,
            RUNS.c.max_attempts,
            RUNS.c.params,
            RUNS.c.queue,
            RUNS.c.priority,
            RUNS.c.time_limit,
            RUNS.c.soft_time_limit,
            RUNS.c.expires_at,
            RUNS.c.created_at == RUNS.c.updated_at,
            RUNS.c.next_retry_at,
            RUNS.c.created_at,
        )
    )
    evs = conn.execute(
        select(
            EVENTS.c.job_id,
            EVENTS.c.attempt,
            EVENTS.c.transition,
            EVENTS.c.from_state,
            EVENTS.c.to_state,
        )
    )
    out = conn.execute(
        select(
            OUTBOX.c.job_id,
            OUTBOX.c.attempt,
            OUTBOX.c.task_name,
            OUTBOX.c.body,
            OUTBOX.c.queue,
            OUTBOX.c.priority,
            OUTBOX.c.published_at,
            OUTBOX.c.available_at,
            OUTBOX.c.created_at,
        )
    )
    bodies = [
        (*r[:3], {k: v for k, v in r[3].items() if k not in ("enqueued_at", "traceparent")}, *r[4:])
        for r in map(_when_due, out)
    ]
    return {
        "runs": sorted(map(_when_due, runs), key=repr),
        "events": sorted(map(tuple, evs), key=repr),
        "outbox": sorted(bodies, key=repr),
    }


def _when_due(row: Any) -> tuple[Any, ...]:
    """A row ending in (due, written): the due time as an offset from the write, but an
    eta's own (the clock readings differ from one play to the next)."""
    *rest, due, written = row
    return (*rest, due if due in (None, ETA) else due - written)


def _played(
    db: Engine, before: Callable[[Connection], None], enqueue: Callable[[Connection], Any]
) -> tuple[Any, dict[str, list[tuple[Any, ...]]]]:
    """Run ``enqueue`` after ``before`` in one transaction; its answers and rows, rolled back."""
    with db.connect() as conn:
        trans = conn.begin()
        before(conn)
        answers = _answers(enqueue(conn))
        rows = _rows(conn)
        trans.rollback()
    return answers, rows


E, D, S = EnqueueOutcome.ENQUEUED, EnqueueOutcome.DUPLICATE, EnqueueOutcome.SKIPPED


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [(_scenario, [E, S, D, E, D, E, S, E]), (_with_rerun, [E, E, S, S]), (_varied, [E] * 6)],
    ids=["mix", "rerun", "varied"],
)
def test_a_batch_answers_and_writes_as_the_same_enqueues_one_by_one(
    db: Engine,
    scenario: Callable[[], tuple[Callable[[Connection], None], list[NewJob]]],
    expected: list[EnqueueOutcome],
) -> None:
    before, jobs = scenario()
    one_by_one = _played(
        db, before, lambda c: [journal.enqueue(c, j, actor="producer") for j in jobs]
    )
    batched = _played(db, before, lambda c: journal.enqueue_many(c, jobs, actor="producer"))
    assert batched == one_by_one
    assert [answer[0] for answer in batched[0]] == expected


@pytest.fixture
def statements(db: Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(db, "before_cursor_execute", record)
    yield seen
    event.remove(db, "before_cursor_execute", record)


def test_a_batch_writes_each_table_with_one_statement(
    db: Engine, statements: list[str], redis_clean: None
) -> None:
    with transaction(app) as batch:
        handles = [tasks.echo.enqueue_in(batch, (f"many{i}",)) for i in range(40)]
    outbox.MARKER.flush()  # PostgreSQL: the fast path's marks are written in bulk, soon after
    writes = [_tables_written(s) for s in statements if _tables_written(s)]
    # No job_events rows: each run row carries its enqueue (journal/row_events.py). On
    # PostgreSQL the runs and their outbox rows go in one statement (journal/unnested.py).
    postgres = db.dialect.name == "postgresql"
    expected = [["job_runs", "outbox"]] if postgres else [["job_runs"], ["outbox"]]
    assert writes == expected, statements
    marks = [s for s in statements if s.startswith("UPDATE outbox")]
    # One UPDATE marks the batch on PostgreSQL; SQLite's marks go row by row (outbox.py).
    assert len(marks) == (1 if db.dialect.name == "postgresql" else 40)
    assert {h.outcome for h in handles} == {EnqueueOutcome.ENQUEUED}
    assert run_count(db) == 40
    assert all(outbox_rows(db, h.job_id)[0]["publish_count"] == 1 for h in handles)
    assert _broker().llen(app.conf.task_default_queue) == 40


def _tables_written(statement: str) -> list[str]:
    """The tables a statement inserts into, in order."""
    words = statement.split()
    return [
        words[i + 2] for i, w in enumerate(words[:-2]) if (w, words[i + 1]) == ("INSERT", "INTO")
    ]


def test_a_handle_read_inside_the_block_and_the_callers_own_writes_see_the_jobs(
    db: Engine, redis_clean: None
) -> None:
    job_id = uuid.uuid4()
    with transaction(app) as batch:
        first = tasks.echo.enqueue_in(batch, ("seen",), job_id=job_id)
        assert first.outcome is EnqueueOutcome.ENQUEUED
        again = tasks.echo.enqueue_in(batch, ("seen",), job_id=job_id)
        later = tasks.echo.enqueue_in(batch, ("later",))
        # The caller's own statement runs after the enqueues before it, as one by one.
        count = batch.conn.execute(text("SELECT count(*) FROM job_runs")).scalar_one()
    assert count == 2
    assert (again.outcome, later.outcome) == (EnqueueOutcome.DUPLICATE, EnqueueOutcome.ENQUEUED)


def _broker() -> redis.Redis:
    return redis.Redis.from_url(service("JOBSAPP_TEST_REDIS_URL"))


def test_a_rolled_back_batch_writes_and_publishes_nothing(db: Engine, redis_clean: None) -> None:
    class Abort(Exception):
        pass

    def enqueue_then_fail() -> None:
        with transaction(app) as batch:
            for i in range(5):
                tasks.echo.enqueue_in(batch, (f"rolled{i}",))
            batch.conn.execute(text("SELECT 1"))  # the jobs are written, then rolled back
            raise Abort

    with pytest.raises(Abort):
        enqueue_then_fail()
    assert run_count(db) == 0
    with db.connect() as conn:
        assert conn.execute(select(OUTBOX.c.id)).first() is None
    assert _broker().llen(app.conf.task_default_queue) == 0


BATCH_PRODUCER = """
import sys, uuid
from jobsapp.celery_app import app
from jobsapp.db import utcnow
from jobsapp.lifecycle.producer.enqueue import transaction
from tests.support import tasks
with transaction(app) as batch:
    for job_id in sys.argv[1:]:
        tasks.echo.enqueue_in(batch, (job_id,), job_id=uuid.UUID(job_id))
"""


@pytest.fixture
def pg_worker(pg: Engine, redis_clean: None) -> Iterator[Engine]:
    """An in-process worker on the Postgres journal (the producer process writes there)."""
    with in_process_worker():
        yield pg


def test_a_batch_producer_killed_after_commit_before_publish_is_relayed(
    pg_worker: Engine, launcher: Launcher
) -> None:
    pg = pg_worker
    ids = [uuid.uuid4() for _ in range(5)]
    producer = launcher.start(
        "batch-producer",
        [sys.executable, "-c", BATCH_PRODUCER, *map(str, ids)],
        {"JOBSAPP_CRASH_AT": "after_commit_before_publish"},
    )
    assert producer.wait(30) == -9, producer.log()
    assert [run_row(pg, i)["state"] for i in ids] == ["queued"] * 5
    assert [outbox_rows(pg, i)[0]["publish_count"] for i in ids] == [0] * 5

    when_due = relay.RelayConfig(grace=timedelta(0))

    def all_ran() -> bool:
        relay.run_once(app, pg, when_due)
        return all(run_row(pg, i)["state"] == "succeeded" for i in ids)

    eventually(all_ran, timeout=30, interval=0.5)
    assert [tasks.calls(str(i)) for i in ids] == [1] * 5
    assert [outbox_rows(pg, i)[0]["publish_count"] for i in ids] == [1] * 5


def test_a_batch_producer_killed_between_round_trips_runs_every_job_once(
    pg_worker: Engine, launcher: Launcher
) -> None:
    """Two of five messages reached the broker (round trips of two), none was marked: the
    two run at once, the relay sends all five, and the claim drops the two copies."""
    pg = pg_worker
    ids = [uuid.uuid4() for _ in range(5)]
    # Round trips of two, to this session's queue (where the worker listens).
    code = (
        f"from jobsapp.celery_app import app\n"
        f"app.conf.task_default_queue = {app.conf.task_default_queue!r}\n"
        f"from jobsapp.lifecycle.transport import outbox\noutbox.PIPELINE_MAX = 2\n{BATCH_PRODUCER}"
    )
    producer = launcher.start(
        "batch-producer",
        [sys.executable, "-c", code, *map(str, ids)],
        {"JOBSAPP_CRASH_AT": "between_publish_round_trips"},
    )
    assert producer.wait(30) == -9, producer.log()
    eventually(
        lambda: [run_row(pg, i)["state"] for i in ids[:2]] == ["succeeded"] * 2,
        timeout=30,
        interval=0.2,
    )
    assert [run_row(pg, i)["state"] for i in ids[2:]] == ["queued"] * 3
    assert [outbox_rows(pg, i)[0]["publish_count"] for i in ids] == [0] * 5

    when_due = relay.RelayConfig(grace=timedelta(0))

    def all_ran() -> bool:
        relay.run_once(app, pg, when_due)
        return all(run_row(pg, i)["state"] == "succeeded" for i in ids)

    eventually(all_ran, timeout=30, interval=0.5)
    assert [tasks.calls(str(i)) for i in ids] == [1] * 5


def test_two_batches_at_once_leave_one_run_per_key_and_job(pg: Engine) -> None:
    """The second batch's statement waits on the first's uncommitted rows, then answers
    as an enqueue after that commit would: its new keys enqueued, the first's keys
    skipped (naming the first's run), the first's job_ids duplicates; one message per run."""
    firsts = [_keyed(f"k{i}") for i in range(40)]
    seconds = [
        *(_keyed(f"k{i}") for i in range(0, 40, 2)),  # the same key, a job of its own
        *firsts[1::2],  # the same job
        *(_keyed(f"new{i}") for i in range(20)),
    ]
    answers: list[EnqueueResult] = []
    with pg.connect() as first:
        trans = first.begin()
        assert {r.outcome for r in journal.enqueue_many(first, firsts, actor="a")} == {E}
        with pg.begin() as other:
            racing = threading.Thread(
                target=lambda: answers.extend(journal.enqueue_many(other, seconds, actor="b"))
            )
            racing.start()
            eventually(lambda: waiting_for_a_lock(pg), timeout=20)
            trans.commit()
            racing.join(timeout=30)
    by_key = {job.concurrency_key: job.job_id for job in firsts}
    assert [(r.outcome, r.holder) for r in answers[:20]] == [
        (S, by_key[job.concurrency_key]) for job in seconds[:20]
    ]
    assert [r.outcome for r in answers[20:40]] == [D] * 20
    assert [r.outcome for r in answers[40:]] == [E] * 20
    assert run_count(pg) == 60
    with pg.connect() as conn:
        outbox_jobs = [row.job_id for row in conn.execute(select(OUTBOX.c.job_id))]
    assert sorted(outbox_jobs) == sorted(j.job_id for j in [*firsts, *seconds[40:]])
