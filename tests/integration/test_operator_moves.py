"""An operator's moves that change no run's state, on Postgres and SQLite: run now (a job
waiting for its time made due) and the retry of dead outbox rows; what each leaves in the
journal, and that nothing is written when the move is refused."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Engine, event, update

from jobsapp import operator
from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import OUTBOX
from jobsapp.lifecycle.transport import outbox
from tests.support import tasks
from tests.support.journal_view import events, outbox_rows, run_row, transitions

REASON = "upstream is back"


@pytest.fixture
def broker() -> Celery:
    """A real in-memory kombu broker: what these tests publish stays with them."""
    return Celery("operator-moves-tests", broker="memory://")


def waiting_job(db: Engine, delay: timedelta | None = timedelta(hours=1)) -> uuid.UUID:
    """A queued job due ``delay`` from now (a countdown), with its message."""
    job = dataclasses.replace(tasks.echo.new_job(("m",), {}, uuid.uuid4()), delay=delay)
    with db.begin() as conn:
        journal.enqueue(conn, job, actor="producer")
    return job.job_id


def kill_message(db: Engine, job_id: uuid.UUID) -> int:
    """The job's first message dead (it kept failing to publish); returns its row's id."""
    with db.begin() as conn:
        return int(
            conn.execute(
                update(OUTBOX)
                .where(OUTBOX.c.job_id == job_id, OUTBOX.c.attempt == 1)
                .values(dead_at=utcnow(), publish_failures=5, last_error="InvalidMessage: x")
                .returning(OUTBOX.c.id)
            ).scalar_one()
        )


def audit(db: Engine, job_id: uuid.UUID, transition: str) -> list[tuple[Any, ...]]:
    return [
        (e["actor"], e["reason"], e["attempt"])
        for e in events(db, job_id)
        if e["transition"] == transition
    ]


def run_now(db: Engine, broker: Celery, job_id: uuid.UUID, **kw: Any) -> operator.RunNowResult:
    return operator.run_now(db, "jobs", job_id, actor="ed", reason=REASON, app=broker, **kw)


def test_run_now_makes_a_waiting_job_due_publishes_it_and_names_the_operator(
    db: Engine, broker: Celery
) -> None:
    job_id = waiting_job(db)

    assert run_now(db, broker, job_id).published
    outbox.MARKER.flush()  # the fast path marks its rows in bulk, a moment after publishing
    run = run_row(db, job_id)
    assert (run["state"], run["attempts"]) == ("queued", 0)
    assert run["next_retry_at"] <= utcnow()
    (message,) = outbox_rows(db, job_id)
    assert (message["publish_count"], message["dead_at"]) == (1, None)
    assert message["published_at"] is not None
    assert audit(db, job_id, "run_now") == [("operator:ed", REASON, 0)]


@pytest.mark.parametrize("delay", [None, timedelta(hours=1)], ids=["already-due", "moved-on"])
def test_run_now_refused_writes_nothing(
    db: Engine, broker: Celery, delay: timedelta | None
) -> None:
    """A job already due, or one the operator saw at another attempt, is refused."""
    job_id = waiting_job(db, delay)
    run, messages = run_row(db, job_id), outbox_rows(db, job_id)
    seen = 0 if delay is None else 1

    with pytest.raises(operator.Conflict) as refused:
        run_now(db, broker, job_id, attempts=seen)
    assert refused.value.code == "not_scheduled"
    assert (run_row(db, job_id), outbox_rows(db, job_id)) == (run, messages)
    assert "run_now" not in transitions(db, job_id)


def test_run_now_of_a_job_whose_message_is_dead_moves_the_run_and_leaves_the_row_dead(
    db: Engine, broker: Celery
) -> None:
    job_id = waiting_job(db)
    kill_message(db, job_id)

    assert not run_now(db, broker, job_id).published
    assert run_row(db, job_id)["next_retry_at"] <= utcnow()
    (message,) = outbox_rows(db, job_id)
    assert message["dead_at"] is not None
    assert audit(db, job_id, "run_now") == [("operator:ed", REASON, 0)]


def test_a_retry_of_named_dead_rows_revives_those_alone_each_with_its_audit_row(
    db: Engine, broker: Celery
) -> None:
    named, other = waiting_job(db, None), waiting_job(db, None)
    row_id = kill_message(db, named)
    kill_message(db, other)

    assert operator.retry_dead_outbox(db, [row_id], actor="ed", reason=REASON, app=broker) == 1
    outbox.MARKER.flush()
    (revived,) = outbox_rows(db, named)
    assert (revived["dead_at"], revived["publish_failures"], revived["last_error"]) == (
        None,
        0,
        None,
    )
    assert revived["published_at"] is not None
    assert audit(db, named, "outbox_retry") == [("operator:ed", REASON, 1)]
    (still_dead,) = outbox_rows(db, other)
    assert still_dead["dead_at"] is not None
    assert "outbox_retry" not in transitions(db, other)
    # Revived once: a second retry finds no dead row to take.
    assert operator.retry_dead_outbox(db, [row_id], actor="ed", reason=REASON, app=broker) == 0


@pytest.fixture
def statements(pg: Engine) -> Iterator[list[str]]:
    """Every statement sent to Postgres meanwhile."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(" ".join(statement.split()))

    event.listen(pg, "before_cursor_execute", record)
    yield sent
    event.remove(pg, "before_cursor_execute", record)


def audited_by(sent: list[str]) -> list[str]:
    return [s for s in sent if "INSERT INTO job_events" in s]


def test_on_postgres_each_move_writes_its_audit_row_in_the_statement_that_moves(
    pg: Engine, broker: Celery, statements: list[str]
) -> None:
    """One guarded statement each: no audit row without its move, even in autocommit."""
    job_id = waiting_job(pg)
    run_now(pg, broker, job_id)
    (moved,) = audited_by(statements)
    assert "UPDATE job_runs" in moved
    assert "UPDATE outbox" in moved

    statements.clear()
    for dead in (waiting_job(pg, None), waiting_job(pg, None)):
        kill_message(pg, dead)
    assert operator.retry_dead_outbox(pg, None, actor="ed", reason=REASON, app=broker) == 2
    (revived,) = audited_by(statements)
    assert "UPDATE outbox" in revived
