"""What the journal adds under Celery's result idioms (tests/conformance/ puts the idioms
themselves beside bare Celery, on real prefork workers): a revoke is final at once, the run
outlives ``forget()``, a handle carries the journal's extras, and a refusal is never retried.
On both dialects, with the in-process worker."""

from __future__ import annotations

import pytest
from celery.exceptions import TaskRevokedError
from celery.result import AsyncResult
from sqlalchemy import Engine

from jobsapp.celery_app import app as jobsapp_app
from jobsapp.lifecycle.handle import JobHandle
from tests.support import idiom_tasks
from tests.support.journal_view import run_row

pytestmark = pytest.mark.timeout(180)

WAIT = 20


def _raised_kind(r: AsyncResult) -> str:
    try:
        r.get(timeout=WAIT)
    except Exception as exc:  # noqa: BLE001 - the answer is which exception
        return type(exc).__name__
    return "nothing raised"


def test_a_revoked_job_raises_celerys_task_revoked_error_at_once(
    worker: object, db: Engine
) -> None:
    r = idiom_tasks.add.apply_async((1, 1), countdown=60)
    r.revoke()
    # Celery says REVOKED only when the worker meets the message at its eta; the journal
    # says it at once, and the job never runs.
    assert (r.state, _raised_kind(r)) == ("REVOKED", "TaskRevokedError")
    assert isinstance(r.result, TaskRevokedError)
    assert run_row(db, r.job_id)["outcome"] == "cancelled"


def test_forget_drops_the_value_and_keeps_the_run_in_the_journal(
    worker: object, db: Engine
) -> None:
    r = idiom_tasks.add.delay(20, 22)
    assert r.get(timeout=WAIT) == 42
    r.forget()
    again = AsyncResult(r.id, app=jobsapp_app)
    # By design (docs/celery-compat.md): the run is the audit trail; only its value goes.
    assert (again.result, run_row(db, r.job_id)["state"]) == (None, "succeeded")


def test_a_handle_is_celerys_async_result_with_the_journals_extras(worker: object) -> None:
    r = idiom_tasks.add.delay(1, 2)
    assert isinstance(r, AsyncResult)
    assert isinstance(r, JobHandle)
    assert r.get(timeout=WAIT) == 3
    assert (r.journal_state, r.outcome.value, str(r.job_id)) == ("succeeded", "enqueued", r.id)


def test_replace_is_refused_in_one_line_and_never_retried(worker: object, db: Engine) -> None:
    r = idiom_tasks.replaced.delay(1)
    with pytest.raises(TypeError, match=r"^tests\.idioms\.replaced\.replace: a lifecycle job"):
        r.get(timeout=WAIT)
    row = run_row(db, r.job_id)
    assert (row["outcome"], row["attempts"]) == ("permanent", 1)


def test_chunks_of_a_lifecycle_task_is_refused_at_the_call_in_one_line() -> None:
    with pytest.raises(TypeError, match=r"^tests\.idioms\.add\.chunks: .* use starmap"):
        idiom_tasks.add.chunks(zip(range(4), range(4), strict=True), 2)
