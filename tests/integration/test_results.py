"""A body's return value, kept with its run: what a Celery user with a result backend
checks, written as they write it.

Where Celery defines the answer (``get()``, ``result``, ``successful()``, ``date_done``,
``traceback``) a bare Celery app with a Redis result backend runs the same body first, on
a worker of its own (two in-process workers cannot share a process), then the lifecycle
task runs on jobsapp's. What jobsapp adds is checked in the journal: the value is on the run
row, and a value the run cannot keep fails the job with a code naming why.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path

import pytest
from kombu.exceptions import EncodeError
from sqlalchemy import Engine

from jobsapp.lifecycle import journal
from jobsapp.lifecycle.rules.errors import ResultRefused
from jobsapp.lifecycle.rules.states import State, Transition
from jobsapp.settings import DEFAULT_RESULT_MAX_BYTES
from tests.support import first_hour_tasks as hour
from tests.support import result_tasks
from tests.support.journal_view import run_row
from tests.support.migrations import sqlite_then_postgres
from tests.support.tasks import calls
from tests.support.workers import in_process_worker

pytestmark = pytest.mark.timeout(120)


def _token(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def test_get_returns_what_the_body_returned_as_with_a_result_backend(
    db: Engine, redis_clean: None
) -> None:
    with result_tasks.bare_worker() as bare:
        theirs = bare.tasks["bare.results.add"].delay(2, 3)
        assert theirs.get(timeout=20) == 5
    with in_process_worker():
        ours = hour.add.delay(2, 3)
        assert ours.get(timeout=20) == 5
    looked_up = hour.add.AsyncResult(ours.id)
    assert looked_up.get(timeout=20) == 5
    for result in (theirs, ours, looked_up):
        assert (result.result, result.successful(), result.state) == (5, True, "SUCCESS")
        assert isinstance(result.date_done, datetime)
        assert result.traceback is None
    assert run_row(db, ours.job_id)["result"] == 5


def test_a_failures_traceback_names_the_bodys_exception_as_with_a_result_backend(
    db: Engine, redis_clean: None
) -> None:
    token = _token("refuse")
    with result_tasks.bare_worker() as bare:
        theirs = bare.tasks["bare.results.refuse"].delay(f"bare-{token}")
        with pytest.raises(ValueError, match="no way"):
            theirs.get(timeout=20)
    with in_process_worker():
        ours = hour.refuse.delay(token)
        with pytest.raises(ValueError, match="no way") as raised:
            ours.get(timeout=20)
    # jobsapp's detail rides on Celery's exception.
    assert (raised.value.job_id, raised.value.outcome) == (ours.job_id, "exhausted")
    for result in (theirs, ours):
        assert result.failed()
        assert result.date_done is not None
        assert "ValueError" in result.traceback
        assert "no way, " in result.traceback
        assert isinstance(result.get(propagate=False), Exception)
        assert isinstance(result.result, Exception)
    assert run_row(db, ours.job_id)["result"] is None


def test_a_value_json_cannot_carry_fails_the_job_as_celerys_encode_error_fails_the_task(
    db: Engine, redis_clean: None
) -> None:
    token = _token("opaque")
    with result_tasks.bare_worker() as bare:
        theirs = bare.tasks["bare.results.opaque"].delay(f"bare-{token}")
        with pytest.raises(EncodeError):
            theirs.get(timeout=20)
    with in_process_worker():
        ours = result_tasks.opaque.delay(token)
        with pytest.raises(EncodeError, match=r"tests.results.opaque returned a Opaque, not JSON"):
            ours.get(timeout=20)
    assert theirs.failed()
    row = run_row(db, ours.job_id)
    # The body ran once: its work is done, and another attempt would return the same.
    assert (row["outcome"], row["attempts"], calls(token)) == ("permanent", 1, 1)
    assert "ResultRefused" in ours.traceback


def test_a_datetime_result_comes_back_a_datetime_as_from_celerys_json_serializer(
    db: Engine, redis_clean: None
) -> None:
    when = "2026-12-04T01:02:03.456789+00:00"
    with result_tasks.bare_worker() as bare:
        theirs = bare.tasks["bare.results.parsed"].delay(when).get(timeout=20)
    with in_process_worker():
        ours = result_tasks.parsed.delay(when)
        got = ours.get(timeout=20)
    assert (got, type(got)) == (theirs, type(theirs)) == (datetime.fromisoformat(when), datetime)
    # The run row keeps kombu's encoded form: plain JSON.
    assert run_row(db, ours.job_id)["result"] == {"__type__": "datetime", "__value__": when}


def test_a_value_over_the_cap_fails_with_the_documented_error_and_one_at_it_is_kept(
    worker: object, db: Engine
) -> None:
    # A string's JSON is the string and its two quotes.
    at_cap = result_tasks.sized.delay(_token("at"), DEFAULT_RESULT_MAX_BYTES - 2)
    over = result_tasks.sized.delay(_token("over"), DEFAULT_RESULT_MAX_BYTES - 1)

    assert at_cap.get(timeout=20) == "x" * (DEFAULT_RESULT_MAX_BYTES - 2)
    with pytest.raises(ResultRefused) as failed:
        over.get(timeout=20)
    assert failed.value.outcome == "permanent"  # type: ignore[attr-defined]
    assert (
        f"returned {DEFAULT_RESULT_MAX_BYTES + 1} bytes of JSON, over the result cap of "
        f"{DEFAULT_RESULT_MAX_BYTES} bytes (JOBSAPP_RESULT_MAX_BYTES)"
    ) in str(failed.value)
    assert run_row(db, over.job_id)["last_error"].startswith("[result_too_large] ")


def test_a_result_comes_back_as_json_gives_it(worker: object, db: Engine) -> None:
    done = result_tasks.structured.delay(4)

    assert done.get(timeout=20) == {"pair": [4, 5], "nested": {"ok": True, "none": None}}


def test_a_rerun_forgets_the_previous_result(db: Engine) -> None:
    """A succeeded run taken again (a rerun) has no result until its new attempt ends."""
    job = hour.add.new_job((1, 2), {}, None)
    with db.begin() as conn:
        journal.enqueue(conn, job, actor="producer")
        claimed = journal.claim(conn, job.spec, job.job_id, 1, worker="w", now=None)
        assert claimed is not None
        assert journal.succeed(
            conn, job.spec, job.job_id, 1, token=claimed.claimed_token, actor="w", result=3
        )
    assert run_row(db, job.job_id)["result"] == 3
    with db.begin() as conn:
        journal.reopen(
            conn,
            job.spec,
            job.job_id,
            from_state=State.SUCCEEDED,
            attempts=1,
            budget=1,
            transition=Transition.RERUN,
            actor="producer",
            reason="again",
        )
    row = run_row(db, job.job_id)
    assert (row["state"], row["result"]) == ("queued", None)
    assert hour.add.AsyncResult(str(job.job_id)).result is None


def test_a_body_that_commits_through_completing_keeps_the_result_it_passes(
    worker: object, db: Engine
) -> None:
    assert result_tasks.completes.delay(7).get(timeout=20) == {"kept": 7}


def test_apply_of_a_body_over_the_cap_fails_as_the_worker_would(pg: Engine) -> None:
    token = _token("eager-over")
    eager = result_tasks.sized.apply((token, DEFAULT_RESULT_MAX_BYTES))

    assert eager.status == "FAILURE"
    with pytest.raises(ResultRefused, match="over the result cap of 65536 bytes"):
        eager.get()
    row = run_row(pg, uuid.UUID(eager.id))
    assert (row["outcome"], row["result"], calls(token)) == ("permanent", None, 1)


def test_migration_0012_goes_down_and_up_again_on_both_dialects(tmp_path: Path) -> None:
    sqlite_then_postgres(tmp_path, "results", "result", below="0011")
