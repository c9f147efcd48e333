"""The fast path's publish marks: written in bulk after the publish, never a second copy.

Real Postgres and Redis; no worker runs, so every message the producer or the relay sent
is still in the broker's queue to be counted.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from celery.utils.saferepr import saferepr
from sqlalchemy import Engine, event, select

from jobsapp.celery_app import app
from jobsapp.lifecycle.journal import OUTBOX, outbox_queries
from jobsapp.lifecycle.producer import enqueue
from jobsapp.lifecycle.rules import message
from jobsapp.lifecycle.rules.message import fast_valid
from jobsapp.lifecycle.transport import outbox
from jobsapp.maintenance import relay
from tests.support import tasks
from tests.support.env import service
from tests.support.waiting import eventually

# The relay's grace set to nothing: a row not marked yet would be sent again at once.
NO_GRACE = relay.RelayConfig(grace=timedelta(0))


@pytest.fixture
def broker(redis_clean: None) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(service("JOBSAPP_TEST_REDIS_URL"))
    yield client
    client.close()


@pytest.fixture
def outbox_updates(pg: Engine) -> Iterator[list[str]]:
    """The UPDATE statements on the outbox that this test's process sends."""
    seen: list[str] = []

    def record(*args: Any) -> None:
        statement = args[2]
        if statement.lstrip().upper().startswith("UPDATE OUTBOX"):
            seen.append(statement)

    event.listen(pg, "before_cursor_execute", record)
    yield seen
    event.remove(pg, "before_cursor_execute", record)


def _marks(pg: Engine) -> list[tuple[int, bool]]:
    with pg.connect() as conn:
        rows = conn.execute(select(OUTBOX.c.publish_count, OUTBOX.c.published_at.is_not(None)))
        return [tuple(r) for r in rows]  # type: ignore[misc]


def _all_marked(pg: Engine, count: int) -> bool:
    return _marks(pg) == [(1, True)] * count


def test_a_batch_of_publishes_is_marked_by_one_update(
    pg: Engine, broker: redis.Redis, outbox_updates: list[str]
) -> None:
    with enqueue.transaction(app) as batch:
        for i in range(30):
            tasks.echo.enqueue_in(batch, (f"batch-{i}",))
    eventually(lambda: _all_marked(pg, 30), timeout=10)
    assert len(outbox_updates) == 1
    assert broker.llen(app.conf.task_default_queue) == 30


def test_marked_rows_are_not_sent_again_by_the_relay(pg: Engine, broker: redis.Redis) -> None:
    handles = [tasks.echo.delay(f"delay-{uuid.uuid4().hex[:6]}") for _ in range(5)]
    outbox.MARKER.flush()
    assert _all_marked(pg, len(handles))
    assert relay.run_once(app, pg, NO_GRACE)["published"] == 0
    assert _all_marked(pg, len(handles))
    assert broker.llen(app.conf.task_default_queue) == len(handles)


def test_a_delay_checks_its_body_once(
    pg: Engine, broker: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[dict[str, Any]] = []

    def counting(body: dict[str, Any]) -> bool:
        checked.append(body)
        return fast_valid(body)

    monkeypatch.setattr(message, "fast_valid", counting)
    tasks.echo.delay("once")
    assert len(checked) == 1
    assert broker.llen(app.conf.task_default_queue) == 1


def test_flower_shows_the_kwargs_text_celery_would_make(pg: Engine, broker: redis.Redis) -> None:
    tasks.echo.delay("shown")
    (raw,) = broker.lrange(app.conf.task_default_queue, 0, -1)
    sent = json.loads(raw)
    _, kwargs, _ = json.loads(base64.b64decode(sent["body"]))
    assert sent["headers"]["kwargsrepr"] == saferepr(kwargs, app.amqp.kwargsrepr_maxsize)


def test_a_mark_that_comes_after_a_later_publish_changes_nothing(
    pg: Engine, broker: redis.Redis
) -> None:
    with enqueue.transaction(app) as batch:
        tasks.echo.enqueue_in(batch, ("late",))
    outbox.MARKER.flush()
    with pg.connect() as conn:
        (row,) = conn.execute(select(OUTBOX.c.id, OUTBOX.c.available_at)).all()
    # The fast path's mark, seen at publish count 0, arriving once the row was marked.
    late = outbox_queries.Accepted(row.id, 0, timedelta(hours=1), row.available_at)
    with pg.begin() as conn:
        assert outbox_queries.mark_published(conn, [late]) == 0
    assert _all_marked(pg, 1)
    with pg.connect() as conn:
        assert conn.execute(select(OUTBOX.c.available_at)).scalar_one() == row.available_at
