"""A pool child's task-started events (lifecycle/worker/celery_view.py ``send_started``), on
the real Redis: held for at most ``EVENTS_WINDOW`` and published together in Celery's
``task.multi`` messages, as Celery's worker publishes its own task events; every event
arrives, and a lone one is not held for company."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from celery import Celery

from jobsapp.lifecycle.worker import celery_view
from tests.support.env import SESSION, service
from tests.support.event_watch import Watch, watching

_hosts = itertools.count()


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("events-tests", broker=service("JOBSAPP_TEST_REDIS_URL"), set_as_current=False)
    yield app
    app.close()


@pytest.fixture
def watched(app: Celery) -> Iterator[Watch]:
    with watching(app, f"probe-{SESSION}@here") as watch:
        yield watch


def _host() -> str:
    # A dispatcher is kept per process and worker name: each test starts with a new one.
    return f"events-{SESSION}-{next(_hosts)}@here"


def test_started_events_of_quick_jobs_go_out_together_and_every_one_arrives(
    app: Celery, watched: Watch
) -> None:
    host = _host()
    ids = [f"{SESSION}-job-{i}" for i in range(30)]

    for task_id in ids:
        celery_view.send_started(app, task_id, host, {"args": "()", "kwargs": "{}"})
    messages = watched.until(host, len(ids))

    events = [event for _, batch in messages for event in batch]
    assert sorted(e["uuid"] for e in events) == sorted(ids)
    assert {e["type"] for e in events} == {"task-started"}
    assert {e["hostname"] for e in events} == {host}
    # 24 to a message (Celery's buffer limit), the rest within the window: not one each.
    assert len(messages) <= 2, [(key, len(batch)) for key, batch in messages]
    assert {key for key, _ in messages} == {"task.multi"}


def test_a_lone_started_event_is_published_without_waiting_for_more(
    app: Celery, watched: Watch
) -> None:
    host = _host()

    celery_view.send_started(app, f"{SESSION}-alone", host, {"args": "()", "kwargs": "{}"})
    messages = watched.until(host, 1)

    assert [e["uuid"] for _, batch in messages for e in batch] == [f"{SESSION}-alone"]
