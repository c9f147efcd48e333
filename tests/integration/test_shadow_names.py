"""``apply_async(shadow=...)``: the name logs, events and Flower show for a call.

As in Celery, every message of the call carries it in its ``shadow`` header (a retry's too)
and the worker names the task so; the task that runs, and ``AsyncResult(id).name``, stay
the task's own. It is kept with the run, so whoever publishes a message sends it: the
caller's fast path, the worker's retry, or beat's relay when the broker did not answer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery.result import AsyncResult
from celery.signals import before_task_publish, task_received
from sqlalchemy import Engine

from jobsapp.attachments.tasks import process_attachment
from jobsapp.celery_app import app
from jobsapp.lifecycle.transport import publisher
from jobsapp.maintenance import relay
from tests.support import tasks
from tests.support.journal_view import outbox_rows, run_count
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(120)

SHOWN = "billing.render"


@pytest.fixture
def shown() -> Iterator[dict[str, list[Any]]]:
    """The ``shadow`` header of each message of ``tests.flaky`` published here, and the
    name the worker gave each one it received (what its log lines and events say)."""
    seen: dict[str, list[Any]] = {"published": [], "received": []}

    def published(sender: str, headers: dict[str, Any], **_: Any) -> None:
        if sender == tasks.flaky.name:
            seen["published"].append(headers.get("shadow"))

    def received(request: Any, **_: Any) -> None:
        if request.type == tasks.flaky.name:  # the task it runs; its name is shown
            seen["received"].append(request.name)

    before_task_publish.connect(published, weak=False)
    task_received.connect(received, weak=False)
    yield seen
    before_task_publish.disconnect(published)
    task_received.disconnect(received)


def flaky_call(token: str) -> dict[str, Any]:
    """A call whose first attempt fails: its retry is a message of its own."""
    return {"token": token, "fail_times": 1, "secret": "s"}


def test_a_call_shows_its_shadow_on_every_attempt_and_runs_its_own_task(
    worker: object, db: Engine, shown: dict[str, list[Any]]
) -> None:
    token = uuid.uuid4().hex[:8]
    r = tasks.flaky.apply_async(kwargs=flaky_call(token), shadow=SHOWN)

    assert r.get(timeout=30) is None
    assert tasks.calls(token) == 2
    assert AsyncResult(r.id, app=app).name == tasks.flaky.name
    assert shown["published"] == [SHOWN, SHOWN]
    assert shown["received"] == [SHOWN, SHOWN]


def test_the_relay_sends_the_shadow_when_the_caller_could_not(
    worker: object, db: Engine, shown: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
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
    assert shown["published"] == [SHOWN, SHOWN]


def test_a_shadow_that_is_no_name_or_has_no_place_to_be_kept_is_refused(db: Engine) -> None:
    with pytest.raises(TypeError, match=r"shadow is a name to show, a string, not int"):
        tasks.echo.apply_async(("t",), shadow=7)
    ids = {"attachment_id": uuid.uuid4(), "pipeline_version": 1}
    with pytest.raises(TypeError, match=r"shadow= needs a run table that keeps the call"):
        process_attachment.apply_async(kwargs=ids, shadow=SHOWN)
    assert run_count(db) == 0
