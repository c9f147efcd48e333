"""What the journal adds under Celery's result idioms (tests/conformance/ puts the idioms
themselves beside bare Celery, on real prefork workers): a revoke is final at once, the run
outlives ``forget()``, a handle carries the journal's extras, a ``replace()`` hands its answer
to one new job written with its success, and a refusal is never retried.
On both dialects, with the in-process worker."""

from __future__ import annotations

import celery.exceptions
import pytest
from celery import chain
from celery.exceptions import TaskRevokedError
from celery.result import AsyncResult
from sqlalchemy import Engine
from sqlalchemy.exc import NoResultFound

from jobsapp.celery_app import app as jobsapp_app
from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.rules.results import REPLACED_MARK, replaced_by
from jobsapp.lifecycle.workflows import replacement
from tests.support import idiom_tasks
from tests.support.journal_view import run_row
from tests.support.waiting import eventually

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


def test_get_with_on_message_times_out_on_a_job_that_never_ran_and_tells_nothing(
    db: Engine,
) -> None:
    # No worker: the job stays queued, which Celery never publishes as a state.
    r = idiom_tasks.add.apply_async((1, 1), countdown=60)
    told: list[object] = []
    with pytest.raises(celery.exceptions.TimeoutError):
        AsyncResult(r.id, app=jobsapp_app).get(timeout=0.3, interval=0.05, on_message=told.append)
    assert told == []
    assert run_row(db, r.job_id)["state"] == "queued"


def test_a_handle_is_celerys_async_result_with_the_journals_extras(worker: object) -> None:
    r = idiom_tasks.add.delay(1, 2)
    assert isinstance(r, AsyncResult)
    assert isinstance(r, JobHandle)
    assert r.get(timeout=WAIT) == 3
    assert (r.journal_state, r.outcome.value, str(r.job_id)) == ("succeeded", "enqueued", r.id)


def test_replace_hands_the_answer_to_one_new_job_written_with_the_success(
    worker: object, db: Engine
) -> None:
    r = idiom_tasks.replaced.delay(1)
    assert r.get(timeout=WAIT) == 2
    assert AsyncResult(r.id, app=jobsapp_app).state == "SUCCESS"
    successor = replacement.successor_of(r.job_id)
    replaced, new = run_row(db, r.job_id), run_row(db, successor)
    assert (replaced["state"], replaced["attempts"]) == ("succeeded", 1)
    assert replaced["result"] == {REPLACED_MARK: str(successor)}
    assert (new["task_name"], new["state"], new["result"]) == ("tests.idioms.add", "succeeded", 2)


@pytest.mark.parametrize(("kind", "answer"), [("chain", 3), ("chord", 6)])
def test_replace_by_a_chain_or_a_chord_answers_with_its_last_step(
    worker: object, db: Engine, kind: str, answer: int
) -> None:
    r = idiom_tasks.replaced_by_canvas.delay(kind, 1)
    assert r.get(timeout=WAIT) == answer
    last = replaced_by(run_row(db, r.job_id)["result"])
    assert last is not None
    assert run_row(db, last)["result"] == answer


def test_replace_by_an_attempt_that_lost_its_claim_writes_no_new_job(
    worker: object, db: Engine
) -> None:
    r = idiom_tasks.replaced_without_its_claim.delay(1)
    eventually(lambda: r.job_id in idiom_tasks.LOST, timeout=WAIT)
    with pytest.raises(NoResultFound):
        run_row(db, replacement.successor_of(r.job_id))


def test_replace_under_apply_runs_the_replacement_here() -> None:
    assert idiom_tasks.replaced.apply((4,)).get() == 5


def test_a_replaced_step_hands_its_place_in_the_chain_to_its_replacement(
    worker: object, db: Engine
) -> None:
    last = chain(idiom_tasks.add.s(1, 1), idiom_tasks.replaced.s(), idiom_tasks.add.s(10)).delay()
    assert last.get(timeout=WAIT) == 13
    replaced = run_row(db, last.parent.job_id)
    successor = replaced_by(replaced["result"])
    assert successor is not None
    # The next step ran once, given the replacement's value, never the replaced step's mark.
    ran = run_row(db, last.job_id)
    assert (ran["attempts"], ran["params"]["args"]) == (1, [3, 10])
    assert run_row(db, successor)["workflow_id"] == replaced["workflow_id"]


def test_a_replace_by_a_group_is_refused_in_one_line_and_never_retried(
    worker: object, db: Engine
) -> None:
    r = idiom_tasks.replaced_by_canvas.delay("group", 1)
    why = "a group cannot answer for one job"
    with pytest.raises(TypeError, match=rf"^tests\.idioms\.replaced_by_canvas\.replace: {why}"):
        r.get(timeout=WAIT)
    row = run_row(db, r.job_id)
    assert (row["outcome"], row["attempts"]) == ("permanent", 1)


def test_chunks_of_a_lifecycle_task_is_refused_at_the_call_in_one_line() -> None:
    with pytest.raises(TypeError, match=r"^tests\.idioms\.add\.chunks: .* use starmap"):
        idiom_tasks.add.chunks(zip(range(4), range(4), strict=True), 2)
