"""A team's own Task class under lifecycle tasks: ``lifecycle_task(app, base=TheirBase)`` and
an app whose ``task_cls`` is theirs keep the journal, their hooks and their ``__call__``.

Celery's documented idioms: a base class whose ``on_failure`` reports to an error tracker
(given the task id the caller holds and the call's arguments), and Flask's ``task_cls``
whose ``__call__`` runs every body inside the application's context. The conformance suite
holds the hooks' answers equal to bare Celery's on real prefork workers
(tests/conformance, "a base Task class's ..."); here the journal's side of it.
"""

from __future__ import annotations

import contextvars
import uuid
from typing import Any, ClassVar

import pytest
from celery import Celery, Task, shared_task
from celery.worker.request import Request
from sqlalchemy import Engine

from jobsapp.celery_app import app
from jobsapp.lifecycle import LifecycleTask, lifecycle_task
from jobsapp.lifecycle.flow import gating
from jobsapp.lifecycle.transport import hooks
from jobsapp.lifecycle.worker import claim
from tests.support.journal_view import outbox_rows, run_row
from tests.support.workers import in_process_worker

pytestmark = pytest.mark.timeout(90)

# What the team's __call__ sets around a body (Flask's app context, a tenant, a locale).
CONTEXT: contextvars.ContextVar[str] = contextvars.ContextVar("context", default="none")
TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="acme")
HEARD: list[tuple[Any, ...]] = []


class FlaskTask(Task):  # type: ignore[type-arg]
    """Flask's documented ``task_cls``: the body called inside the app's context."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        token = CONTEXT.set("app context")
        try:
            return self.run(*args, **kwargs)
        finally:
            CONTEXT.reset(token)


class TeamTask(Task):  # type: ignore[type-arg]
    """A team's base class: every call carries the caller's tenant (a header, as
    tenant-aware Celery libraries send it), every body runs in its context, every failure
    is reported."""

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        headers = options.setdefault("headers", {})
        headers.setdefault("tenant", TENANT.get())
        return super().apply_async(args, kwargs, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        token = CONTEXT.set(f"{self.request.get('tenant')} context")
        try:
            return super().__call__(*args, **kwargs)
        finally:
            CONTEXT.reset(token)

    def on_failure(self, exc: Exception, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        del einfo  # Celery's signature
        HEARD.append(("on_failure", exc, task_id, args, kwargs, self.request.id))

    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        HEARD.append(("on_success", retval, task_id, args, kwargs, self.request.id))


def _in_context(x: int, fail: bool = False) -> str:
    if fail:
        raise ValueError(f"failed {x}")
    return f"{x} in {CONTEXT.get()}"


TEAM = lifecycle_task(app, name="tests.team_task_class.in_context", base=TeamTask, max_retries=0)(
    _in_context
)


def test_a_team_base_class_is_a_lifecycle_task_and_keeps_its_own_methods() -> None:
    classes = TEAM.__class__.__mro__  # TEAM may be Celery's proxy until the app is set up
    assert isinstance(TEAM, LifecycleTask)
    assert isinstance(TEAM, TeamTask)
    # The team's methods come first and reach the journal's through super().
    assert classes.index(TeamTask) < classes.index(LifecycleTask)


def test_a_base_class_call_wraps_the_body_and_its_hooks_hear_the_job(
    db: Engine, redis_clean: None
) -> None:
    HEARD.clear()
    with in_process_worker():
        ok = TEAM.delay(7)
        assert ok.get(timeout=30) == "7 in acme context"
        failed = TEAM.delay(8, fail=True)
        with pytest.raises(ValueError, match="failed 8"):
            failed.get(timeout=30)
    assert run_row(db, uuid.UUID(ok.id))["state"] == "succeeded"
    assert run_row(db, uuid.UUID(failed.id))["state"] == "failed"
    (success,) = (h for h in HEARD if h[0] == "on_success")
    (failure,) = (h for h in HEARD if h[0] == "on_failure")
    # Celery gives a hook the id the caller holds and the call's own arguments.
    assert success == ("on_success", "7 in acme context", ok.id, [7], {}, ok.id)
    _, exc, task_id, args, kwargs, request_id = failure
    assert isinstance(exc, ValueError)
    assert str(exc) == "failed 8"
    assert (task_id, args, kwargs, request_id) == (failed.id, [8], {"fail": True}, failed.id)


def test_an_apps_own_task_cls_stays_under_lifecycle_tasks(db: Engine) -> None:
    flask = Celery("team-task-cls", task_cls=FlaskTask, set_as_current=False)
    flask.conf.update(broker_url="memory://")
    declared = lifecycle_task(flask, name="tests.team_task_class.team_cls")(_in_context)
    assert isinstance(declared, LifecycleTask)
    assert isinstance(declared, FlaskTask)
    plain = lifecycle_task(app, name="tests.team_task_class.plain")(_in_context)
    # jobsapp's own app has Celery's task class: LifecycleTask is the base as it is.
    assert plain.__class__.__mro__[1] is LifecycleTask
    assert declared.apply(args=(3,)).get() == "3 in app context"
    # Called directly, as a team's unit test calls it: inside the app's context too.
    assert declared(4) == "4 in app context"
    assert TEAM(5) == "5 in None context"  # a direct call has no caller's headers


def test_a_team_request_class_must_extend_jobsapps() -> None:
    class OwnRequest(Request):
        pass

    class Requesting(Task):  # type: ignore[type-arg]
        Request = OwnRequest

    with pytest.raises(TypeError, match=r"Requesting.Request must extend .*LifecycleRequest"):
        lifecycle_task(app, name="tests.team_task_class.requesting", base=Requesting)(_in_context)


class Registering(Task):  # type: ignore[type-arg]
    """A team base that notes each task as it joins its app, and calls no ``super()``."""

    joined: ClassVar[list[str]] = []

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        Registering.joined.append(f"{app.main}:{cls.name}")


def test_a_team_on_bound_without_super_keeps_the_paused_queue_honoured() -> None:
    team = Celery("team-on-bound", set_as_current=False)
    team.conf.update(broker_url="memory://")
    declared = lifecycle_task(team, name="tests.team_task_class.on_bound", base=Registering)(
        _in_context
    )
    assert isinstance(declared, LifecycleTask)  # the app's setup: the task joins it
    assert Registering.joined == ["team-on-bound:tests.team_task_class.on_bound"]
    # What LifecycleTask.on_bound registers: a paused queue's messages held on publish
    # (left to the relay) and on claim.
    assert gating.held_while_paused in hooks.publish_filters(team)
    assert gating.while_paused in claim.claim_holds(team)


class Opening(Task):  # type: ignore[type-arg]
    """A team's base that opens each run's context before it (a log's, a tracer's)."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        HEARD.append(("before_start", task_id, args, kwargs, self.request.id))


OPENED = lifecycle_task(app, name="tests.team_task_class.opened", base=Opening, max_retries=0)(
    _in_context
)


def test_before_start_hears_the_job_once_a_run_starts_and_not_for_a_duplicate(
    db: Engine, redis_clean: None
) -> None:
    # Celery's tracer calls before_start ahead of the body, with the message's task id and
    # arguments: for a lifecycle task an attempt's envelope, and before the claim decides
    # whether the body runs at all.
    HEARD.clear()
    with in_process_worker(concurrency=1):  # one thread: messages run in the order sent
        handle = OPENED.delay(5)
        assert handle.get(timeout=30) == "5 in none"
        (message,) = outbox_rows(db, uuid.UUID(handle.id))
        app.send_task(OPENED.name, kwargs={**message["body"], "outbox_id": message["id"]})
        OPENED.delay(6).get(timeout=30)  # sent after the duplicate: that one was delivered
    started = [h for h in HEARD if h[0] == "before_start"]
    assert ("before_start", handle.id, [5], {}, handle.id) in started
    assert len([h for h in started if h[2] == [5]]) == 1


@shared_task(base=LifecycleTask, name="tests.team_task_class.shared", bind=True)
def _shared(self: Any, x: int) -> list[Any]:
    return [x * 2, self.request.id]


def test_a_shared_task_with_the_lifecycle_base_is_a_lifecycle_task(
    db: Engine, redis_clean: None
) -> None:
    # Django projects declare tasks with @shared_task (the app decided at import): with
    # base=LifecycleTask each call is a run in the journal on jobsapp's app.
    declared = app.tasks["tests.team_task_class.shared"]
    assert isinstance(declared, LifecycleTask)
    with in_process_worker():
        handle = _shared.delay(21)
        assert handle.get(timeout=30) == [42, handle.id]
    assert run_row(db, uuid.UUID(handle.id))["state"] == "succeeded"
