"""Celery's result idioms (celery.result and celery.app.task, as the user guide writes
them), run on bare Celery with a Redis result backend and on lifecycle tasks whose result
backend is the journal: the same answers.

Each program is written once and run against both apps; an answer is what a Celery user
checks: a value, a state, an exception's type and message. Exceptions are compared as
``(type name, message)``: the journal rebuilds the body's own exception, as Celery's
backend does.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from celery.exceptions import TaskRevokedError
from celery.result import AsyncResult, GroupResult
from sqlalchemy import Engine

from jobsapp.celery_app import app as jobsapp_app
from jobsapp.lifecycle.handle import JobHandle
from tests.support import idiom_tasks
from tests.support.journal_view import run_row
from tests.support.result_tasks import bare_worker
from tests.support.waiting import eventually
from tests.support.workers import in_process_worker

pytestmark = pytest.mark.timeout(180)

WAIT = 20


class Side:
    """One app's tasks by short name, and the app itself (for ``AsyncResult(id, app=)``,
    ``send_task`` and ``GroupResult.restore``)."""

    def __init__(self, app: Celery, tasks: dict[str, Any], prefix: str) -> None:
        self.app, self.tasks, self.prefix = app, tasks, prefix

    def __getattr__(self, name: str) -> Any:
        return self.tasks[name]

    def name(self, short: str) -> str:
        return f"{self.prefix}.{short}"


def _token() -> str:
    return uuid.uuid4().hex[:8]


def _raised(call: Callable[[], Any]) -> tuple[str, str]:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the answer is which exception
        return type(exc).__name__, str(exc).replace(_TOKENS.get("last", "?"), "<token>")
    return ("nothing raised", "")


_TOKENS: dict[str, str] = {}


def _fresh_token() -> str:
    _TOKENS["last"] = token = _token()
    return token


# --- the programs ------------------------------------------------------------------------


def by_id_from_anywhere(s: Side) -> Any:
    sent = s.add.delay(2, 3)
    held = sent.id  # a Django view keeps only the id
    return [AsyncResult(held, app=s.app).get(timeout=WAIT), isinstance(sent, AsyncResult)]


def send_task_get(s: Side) -> Any:
    return s.app.send_task(s.name("add"), args=(4, 5)).get(timeout=WAIT)


def states_of_success(s: Side) -> Any:
    r = s.add.delay(1, 1)
    value = r.get(timeout=WAIT)
    return [
        value,
        r.state,
        r.status,
        r.ready(),
        r.successful(),
        r.failed(),
        r.result,
        isinstance(r.date_done, datetime),
        r.traceback,
        r.wait(timeout=WAIT),
    ]


def body_exception_from_get(s: Side) -> Any:
    token = _fresh_token()
    r = s.boom.delay(token)
    raised = _raised(lambda: r.get(timeout=WAIT))
    kept = r.get(timeout=WAIT, propagate=False)
    return [
        raised,
        type(kept).__name__,
        r.state,
        r.failed(),
        type(r.result).__name__,
        "ValueError" in (r.traceback or ""),
        r.ready(),
    ]


def autoretry_exhausted_raises_the_listed_exception(s: Side) -> Any:
    token = _fresh_token()
    r = s.missing.delay(token)
    return [_raised(lambda: r.get(timeout=WAIT)), r.state]


def retry_exhausted_raises_max_retries_exceeded(s: Side) -> Any:
    r = s.retried_out.delay(_fresh_token())
    kind, _ = _raised(lambda: r.get(timeout=WAIT))
    return [kind, r.state]


def request_in_a_bound_body(s: Side) -> Any:
    r = s.request_seen.delay(1, k=3)
    seen_id, args, kwargs, retries = r.get(timeout=WAIT)
    return [seen_id == r.id, args, kwargs, retries]


def update_state_shows_progress(s: Side) -> Any:
    token = _fresh_token()
    r = s.progress.delay(token)
    try:
        eventually(lambda: AsyncResult(r.id, app=s.app).state == "PROGRESS", timeout=WAIT)
        seen = AsyncResult(r.id, app=s.app)
        shown = [seen.state, seen.info, seen.ready()]
    finally:
        idiom_tasks.RELEASE.setdefault(token, __import__("threading").Event()).set()
    return [*shown, r.get(timeout=WAIT), r.state]


def unknown_id_is_pending(s: Side) -> Any:
    r = AsyncResult(str(uuid.uuid4()), app=s.app)
    return [r.state, r.ready(), r.result, _raised(lambda: r.get(timeout=0.5))[0]]


def chain_failing_in_the_middle(s: Side) -> Any:
    token = _fresh_token()
    r = chain(s.add.s(1, 1), s.boom.si(token), s.add.s(1)).apply_async()
    return [_raised(lambda: r.get(timeout=WAIT)), type(r.parent).__name__ != "NoneType"]


def chord_with_a_failing_member(s: Side) -> Any:
    token = _fresh_token()
    r = chord([s.add.s(1, 1), s.boom.si(token)], s.add.s(0)).apply_async()
    kind, said = _raised(lambda: r.get(timeout=WAIT))
    # Celery raises the member's error if get() sees it first (``follow_parents``), else
    # the body's ChordError naming it: which one is a race in Celery as here.
    return kind in ("ValueError", "ChordError") and "boom <token>" in said


def group_without_propagation(s: Side) -> Any:
    token = _fresh_token()
    g = group(s.add.s(2, 2), s.boom.si(token)).apply_async()
    values = g.get(timeout=WAIT, propagate=False)
    return [
        values[0],
        type(values[1]).__name__,
        g.ready(),
        g.successful(),
        g.failed(),
        g.completed_count(),
        isinstance(g, GroupResult),
    ]


def group_saved_and_restored(s: Side) -> Any:
    g = group(s.add.s(i, i) for i in range(3)).apply_async()
    g.save()
    restored = GroupResult.restore(g.id, app=s.app)
    return [restored is not None, restored.get(timeout=WAIT) if restored else None]


def callers_own_task_id(s: Side) -> Any:
    mine = f"order-{uuid.uuid4().hex[:8]}"
    r = s.add.apply_async((2, 2), task_id=mine)
    return [r.id == mine, AsyncResult(mine, app=s.app).get(timeout=WAIT), isinstance(r.id, str)]


def countdown_then_value(s: Side) -> Any:
    return s.add.apply_async((5, 5), countdown=1).get(timeout=WAIT)


def group_join_and_chain_parent(s: Side) -> Any:
    joined = group(s.add.s(1, 0), s.add.s(2, 0)).apply_async().join(timeout=WAIT)
    r = chain(s.add.s(1, 1), s.add.s(10)).apply_async()
    return [joined, r.get(timeout=WAIT), r.parent.get(timeout=WAIT)]


def get_timeout_of_a_late_task(s: Side) -> Any:
    r = s.add.apply_async((1, 1), countdown=30)
    return _raised(lambda: r.get(timeout=0.5))[0]


def eager_apply(s: Side) -> Any:
    return [s.add.apply((3, 4)).get(), _raised(lambda: s.boom.apply((_fresh_token(),)).get())[0]]


PROGRAMS: dict[str, tuple[Callable[[Side], Any], Any]] = {
    "AsyncResult(id, app=app).get() from the id alone": (by_id_from_anywhere, [5, True]),
    "app.send_task(name, args).get()": (send_task_get, 9),
    "states of a success": (
        states_of_success,
        [2, "SUCCESS", "SUCCESS", True, True, False, 2, True, None, 2],
    ),
    "the body's exception from get()": (
        body_exception_from_get,
        [("ValueError", "boom <token>"), "ValueError", "FAILURE", True, "ValueError", True, True],
    ),
    "autoretry_for exhausted": (
        autoretry_exhausted_raises_the_listed_exception,
        [("KeyError", "'missing <token>'"), "FAILURE"],
    ),
    "self.retry(max_retries=1) exhausted": (
        retry_exhausted_raises_max_retries_exceeded,
        ["MaxRetriesExceededError", "FAILURE"],
    ),
    "self.request in a bound body": (request_in_a_bound_body, [True, [1], {"k": 3}, 0]),
    "update_state(PROGRESS, meta)": (
        update_state_shows_progress,
        ["PROGRESS", {"step": 1, "token": "<set>"}, False, "done", "SUCCESS"],
    ),
    "an unknown id": (unknown_id_is_pending, ["PENDING", False, None, "TimeoutError"]),
    "a chain failing in the middle": (
        chain_failing_in_the_middle,
        [("ValueError", "boom <token>"), True],
    ),
    "a chord with a failing member": (chord_with_a_failing_member, True),
    "a group's get(propagate=False)": (
        group_without_propagation,
        [4, "ValueError", True, False, True, 1, True],
    ),
    "GroupResult.save() and restore(id)": (group_saved_and_restored, [True, [0, 2, 4]]),
    "eager apply()": (eager_apply, [7, "ValueError"]),
    "apply_async(task_id=...) and AsyncResult of it": (callers_own_task_id, [True, 4, True]),
    "apply_async(countdown=1).get()": (countdown_then_value, 10),
    "a group's join(), a chain's .parent.get()": (group_join_and_chain_parent, [[1, 2], 12, 2]),
    "get(timeout=) of a task not due yet": (get_timeout_of_a_late_task, "TimeoutError"),
}


def _normalized(name: str, answer: Any) -> Any:
    """The token a program made up is not part of the answer."""
    if name == "update_state(PROGRESS, meta)":
        answer[1] = {**answer[1], "token": "<set>"}
    return answer


def _run_all(side: Side) -> dict[str, Any]:
    return {name: _normalized(name, program(side)) for name, (program, _) in PROGRAMS.items()}


def test_result_idioms_answer_as_on_bare_celery(db: Engine, redis_clean: None) -> None:
    with bare_worker(idiom_tasks.BODIES, idiom_tasks.OPTIONS) as bare:
        tasks = {name: bare.tasks[f"bare.results.{name}"] for name in idiom_tasks.BODIES}
        celerys = _run_all(Side(bare, tasks, "bare.results"))
    assert celerys == {name: expected for name, (_, expected) in PROGRAMS.items()}
    with in_process_worker():
        ours = _run_all(Side(jobsapp_app, idiom_tasks.LIFECYCLE, "tests.idioms"))
    assert ours == celerys


def test_a_revoked_job_raises_celerys_task_revoked_error_at_once(
    worker: object, db: Engine
) -> None:
    r = idiom_tasks.LIFECYCLE["add"].apply_async((1, 1), countdown=60)
    r.revoke()
    # Celery says REVOKED only when the worker meets the message at its eta; the journal
    # says it at once, and the job never runs.
    assert (r.state, _raised(lambda: r.get(timeout=WAIT))[0]) == ("REVOKED", "TaskRevokedError")
    assert isinstance(r.result, TaskRevokedError)
    assert run_row(db, r.job_id)["outcome"] == "cancelled"


def test_forget_drops_the_value_and_keeps_the_run_in_the_journal(
    worker: object, db: Engine
) -> None:
    r = idiom_tasks.LIFECYCLE["add"].delay(20, 22)
    assert r.get(timeout=WAIT) == 42
    r.forget()
    again = AsyncResult(r.id, app=jobsapp_app)
    # By design (docs/celery-compat.md): the run is the audit trail; only its value goes.
    assert (again.result, run_row(db, r.job_id)["state"]) == (None, "succeeded")


def test_a_handle_is_celerys_async_result_with_the_journals_extras(worker: object) -> None:
    r = idiom_tasks.LIFECYCLE["add"].delay(1, 2)
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
