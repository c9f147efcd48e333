"""``apply_async(shadow=...)``: the name logs, events and Flower show for a call.

As in Celery, every message of the call carries it in its ``shadow`` header (a retry's too)
and the worker names the task so; the task that runs, and ``AsyncResult(id).name``, stay
the task's own. It is kept with the run, so whoever publishes a message sends it: the
caller's fast path, the worker's retry, or beat's relay when the broker did not answer.
So is the name a task's own ``shadow_name`` gives a call without one (Celery asks it in
``apply_async``), a canvas step's ``shadow``, a ``send_task(shadow=)`` the worker adopts,
and the name and lineage of a limited key's run whose slot another run's worker grants.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery, chain, group
from celery.result import AsyncResult
from celery.signals import before_task_publish, task_received
from sqlalchemy import Engine

from jobsapp.attachments.tasks import process_attachment
from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from jobsapp.lifecycle.transport import publisher
from jobsapp.maintenance import relay
from tests.support import limit_tasks, tasks
from tests.support.journal_view import outbox_rows, run_count
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(120)

SHOWN = "billing.render"
# What a team's ``shadow_name`` was asked: (args, kwargs, options) of each call.
ASKED: list[tuple[Any, ...]] = []


def name_by_token(task: Any, args: Any, kwargs: Any, options: Any) -> str:
    """A team's ``shadow_name``, as Celery's documentation writes one."""
    del task
    ASKED.append((args, kwargs, options))
    return f"report:{kwargs['token']}"


@lifecycle_task(
    app,
    name="tests.shadow_named",
    max_attempts=5,
    retry_policy=tasks.FAST_RETRY,
    shadow_name=name_by_token,
)
def shadow_named(token: str, fail_times: int, secret: str) -> None:
    if tasks.record(token) <= fail_times:
        raise ConnectionError(f"upstream down ({len(secret)})")


def name_none(task: Any, args: Any, kwargs: Any, options: Any) -> None:
    """A team's ``shadow_name`` that leaves a call its task's name."""
    del task
    ASKED.append((args, kwargs, options))


@lifecycle_task(app, name="tests.shadow_unnamed", shadow_name=name_none)
def shadow_unnamed(token: str) -> str:
    return token


@pytest.fixture
def shown() -> Iterator[dict[str, dict[str, list[Any]]]]:
    """By task: the headers of each of its messages published here, and the name the
    worker gave each one it received (what its log lines and events say)."""
    seen: dict[str, dict[str, list[Any]]] = {"published": {}, "received": {}}

    def published(sender: str, headers: dict[str, Any], **_: Any) -> None:
        seen["published"].setdefault(sender, []).append(dict(headers))

    def received(request: Any, **_: Any) -> None:
        # request.type: the task it runs; request.name: the name it shows.
        seen["received"].setdefault(request.type, []).append(request.name)

    before_task_publish.connect(published, weak=False)
    task_received.connect(received, weak=False)
    yield seen
    before_task_publish.disconnect(published)
    task_received.disconnect(received)


def published(shown: dict[str, dict[str, list[Any]]], task: Any, *names: str) -> list[Any]:
    """``names`` of the headers of each message of ``task`` published (the first of each
    alone when there is one)."""
    heads = shown["published"].get(task.name, [])
    if len(names) == 1:
        return [h.get(names[0]) for h in heads]
    return [tuple(h.get(n) for n in names) for h in heads]


def flaky_call(token: str) -> dict[str, Any]:
    """A call whose first attempt fails: its retry is a message of its own."""
    return {"token": token, "fail_times": 1, "secret": "s"}


def test_a_call_shows_its_shadow_on_every_attempt_and_runs_its_own_task(
    worker: object, db: Engine, shown: dict[str, dict[str, list[Any]]]
) -> None:
    token = uuid.uuid4().hex[:8]
    r = tasks.flaky.apply_async(kwargs=flaky_call(token), shadow=SHOWN)

    assert r.get(timeout=30) is None
    assert tasks.calls(token) == 2
    assert AsyncResult(r.id, app=app).name == tasks.flaky.name
    assert published(shown, tasks.flaky, "shadow") == [SHOWN, SHOWN]
    assert shown["received"][tasks.flaky.name] == [SHOWN, SHOWN]


def test_the_relay_sends_the_shadow_when_the_caller_could_not(
    worker: object,
    db: Engine,
    shown: dict[str, dict[str, list[Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A broker that did not answer in time leaves every message to beat's relay.
    monkeypatch.setattr(publisher, "fast_path_open", lambda: False)
    when_due = relay.RelayConfig(grace=timedelta(0))
    token = uuid.uuid4().hex[:8]
    r = tasks.flaky.apply_async(kwargs=flaky_call(token), shadow=SHOWN)

    def relayed() -> bool:
        relay.run_once(app, db, when_due)
        return bool(r.ready())

    eventually(relayed, timeout=30, interval=0.2)
    assert r.get(timeout=5) is None
    assert [row["publish_count"] for row in outbox_rows(db, r.job_id)] == [1, 1]
    assert published(shown, tasks.flaky, "shadow") == [SHOWN, SHOWN]


def test_a_shadow_that_is_no_name_or_has_no_place_to_be_kept_is_refused(db: Engine) -> None:
    with pytest.raises(TypeError, match=r"shadow is a name to show, a string, not int"):
        tasks.echo.apply_async(("t",), shadow=7)
    ids = {"attachment_id": uuid.uuid4(), "pipeline_version": 1}
    with pytest.raises(TypeError, match=r"shadow= needs a run table that keeps the call"):
        process_attachment.apply_async(kwargs=ids, shadow=SHOWN)
    assert run_count(db) == 0


def test_a_tasks_shadow_name_names_its_calls_as_celery_asks_it_and_retries_keep_it(
    worker: object, db: Engine, shown: dict[str, dict[str, list[Any]]]
) -> None:
    # Bare Celery's apply_async, side by side: what it asks the hook, and what it sends.
    bare = Celery("bare", set_as_current=False)
    bare_report = bare.task(name="bare.report", shadow_name=name_by_token)(shadow_named.run)
    sent: list[Any] = []
    bare.send_task = lambda *_, **o: sent.append(o["shadow"])  # type: ignore[method-assign]
    ASKED.clear()
    token = uuid.uuid4().hex[:8]
    bare_report.apply_async(kwargs=flaky_call(token), priority=3)
    r = shadow_named.apply_async(kwargs=flaky_call(token), priority=3)

    assert r.get(timeout=30) is None
    name = f"report:{token}"
    assert sent == [name]
    asked = (None, flaky_call(token), {"priority": 3})
    assert [asked, asked] == ASKED  # the retry asks not
    assert published(shown, shadow_named, "shadow") == [name, name]
    assert shown["received"][shadow_named.name] == [name, name]
    assert AsyncResult(r.id, app=app).name == shadow_named.name
    # A call's own shadow is taken as it is: the hook is not asked.
    shadow_named.apply_async(kwargs=flaky_call(uuid.uuid4().hex[:8]), shadow=SHOWN).get(timeout=30)
    assert len(ASKED) == 2
    assert published(shown, shadow_named, "shadow")[-2:] == [SHOWN, SHOWN]


def test_a_canvas_steps_shadow_and_shadow_name_are_kept_for_its_retries(
    worker: object, db: Engine, shown: dict[str, dict[str, list[Any]]]
) -> None:
    first, then = uuid.uuid4().hex[:8], uuid.uuid4().hex[:8]
    steps = chain(
        shadow_named.si(**flaky_call(first)),
        tasks.flaky.si(**flaky_call(then)).set(shadow=SHOWN),
    )
    r = steps.apply_async()

    assert r.get(timeout=60) is None
    name = f"report:{first}"
    assert published(shown, shadow_named, "shadow") == [name, name]
    assert shown["received"][shadow_named.name] == [name, name]
    assert published(shown, tasks.flaky, "shadow") == [SHOWN, SHOWN]
    assert shown["received"][tasks.flaky.name] == [SHOWN, SHOWN]
    assert AsyncResult(r.id, app=app).name == tasks.flaky.name
    # A whole canvas's shadow names its first tasks, as its queue routes them.
    tokens = [uuid.uuid4().hex[:8] for _ in range(2)]
    group(tasks.echo.s(t) for t in tokens).apply_async(shadow=SHOWN).get(timeout=30)
    assert published(shown, tasks.echo, "shadow") == [SHOWN, SHOWN]


def test_a_send_task_shadow_the_worker_adopts_is_kept_for_its_retries(
    worker: object, db: Engine, shown: dict[str, dict[str, list[Any]]]
) -> None:
    token = uuid.uuid4().hex[:8]
    sent = app.send_task(tasks.flaky.name, kwargs=flaky_call(token), shadow=SHOWN)

    r = AsyncResult(sent.id, app=app)
    assert r.get(timeout=30) is None
    assert tasks.calls(token) == 2
    assert published(shown, tasks.flaky, "shadow") == [SHOWN, SHOWN]
    assert shown["received"][tasks.flaky.name] == [SHOWN, SHOWN]
    assert r.name == tasks.flaky.name


@lifecycle_task(app, name="tests.shadow_fan_out")
def shadow_fan_out(tenant: str) -> list[str]:
    """A team's task that sends a limited key's runs under a name of its own."""
    task = limit_tasks.limited_lineage
    return [task.apply_async((tenant,), shadow=SHOWN).id for _ in range(4)]


def test_a_limited_run_another_runs_worker_publishes_keeps_its_shadow_and_lineage(
    worker: object, db: Engine, shown: dict[str, dict[str, list[Any]]]
) -> None:
    # limit=2: the last two runs wait for a slot, and the worker that ends a holder
    # publishes them (journal/key_slots.py's grant), outside the task that sent them,
    # which Celery's send_task names as their root and parent.
    task, tenant = limit_tasks.limited_lineage, f"shadow-{uuid.uuid4().hex[:8]}"
    sender = shadow_fan_out.apply_async((tenant,))
    ids = sender.get(timeout=30)

    assert [AsyncResult(i, app=app).get(timeout=30) for i in ids] == [[sender.id] * 2] * 4
    kept = (SHOWN, sender.id, sender.id)
    assert published(shown, task, "shadow", "root_id", "parent_id") == [kept] * 4
    assert shown["received"][task.name] == [SHOWN] * 4


def test_a_shadow_name_that_names_none_is_asked_once_for_a_call_with_a_link(
    worker: object, db: Engine, shown: dict[str, dict[str, list[Any]]]
) -> None:
    # Celery asks it once per apply_async; the workflow a link makes of the call asked it
    # again when it was compiled.
    bare = Celery("bare", set_as_current=False)
    bare_unnamed = bare.task(name="bare.unnamed", shadow_name=name_none)(shadow_unnamed.run)
    bare.send_task = lambda *_, **__: None  # type: ignore[method-assign]
    token = uuid.uuid4().hex[:8]
    ASKED.clear()
    bare_unnamed.apply_async((token,), link=bare_unnamed.si(f"{token}-linked"), priority=3)
    theirs = list(ASKED)
    ASKED.clear()
    r = shadow_unnamed.apply_async((token,), link=tasks.echo.si(f"{token}-linked"), priority=3)

    assert r.get(timeout=30) == token
    eventually(lambda: tasks.calls(f"{token}-linked"), timeout=30)
    assert ASKED == theirs == [((token,), None, {"priority": 3})]
    assert published(shown, shadow_unnamed, "shadow") == [None]
