"""Helpers of the attachment tests: configured stores, row views, broker and state waits."""

from __future__ import annotations

import hashlib
import io
import json
import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import redis
from PIL import Image
from sqlalchemy import Engine, func, select

from jobsapp.attachments.models import ATTACHMENTS, RUNS, VARIANTS
from jobsapp.attachments.service import get_attachment
from jobsapp.attachments.store import clear_store_cache, get_store
from jobsapp.celery_app import app
from jobsapp.settings import get_settings
from jobsapp.storage import ObjectStore
from tests.support.waiting import eventually

# Nothing listens here (TCP port 9, "discard"): a store that is down, refusing connections.
DEAD_S3_ENDPOINT = "http://127.0.0.1:9"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def refresh_settings() -> None:
    """Make the process (and its in-process worker) read the environment again."""
    get_settings.cache_clear()
    clear_store_cache()


@contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set variables and refresh the settings; restore both afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    refresh_settings()
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
        refresh_settings()


@contextmanager
def configured_store(url: str, endpoint_url: str = "") -> Iterator[ObjectStore]:
    """The process stores attachments at ``url`` meanwhile; its objects are removed after."""
    with environment(JOBSAPP_STORAGE_URL=url, JOBSAPP_S3_ENDPOINT_URL=endpoint_url):
        store = get_store()
        try:
            yield store
        finally:
            for info in list(store.list("")):
                store.delete(info.key)


def attachment_row(engine: Engine, attachment_id: uuid.UUID) -> Mapping[str, Any]:
    with engine.connect() as conn:
        stmt = select(ATTACHMENTS).where(ATTACHMENTS.c.id == attachment_id)
        return dict(conn.execute(stmt).mappings().one())


def variant_rows(engine: Engine, attachment_id: uuid.UUID) -> list[dict[str, Any]]:
    stmt = (
        select(VARIANTS)
        .where(VARIANTS.c.attachment_id == attachment_id)
        .order_by(VARIANTS.c.pipeline_version, VARIANTS.c.variant)
    )
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(stmt).mappings()]


def run_rows(engine: Engine, attachment_id: uuid.UUID) -> list[dict[str, Any]]:
    stmt = (
        select(RUNS)
        .where(RUNS.c.attachment_id == attachment_id)
        .order_by(RUNS.c.pipeline_version, RUNS.c.created_at)
    )
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(stmt).mappings()]


def count(engine: Engine, table: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def settled(attachment_id: uuid.UUID, state: str, timeout: float = 30.0) -> dict[str, Any]:
    """The attachment's view once it reached ``state``; fails naming the last state seen."""
    last: dict[str, Any] = {}

    def probe() -> dict[str, Any] | None:
        view = get_attachment(attachment_id)
        assert view is not None
        last.update(view)
        return view if view["state"] == state else None

    try:
        return eventually(probe, timeout=timeout)
    except AssertionError:
        raise AssertionError(f"attachment never became {state}: {last}") from None


def staging_dropped(store: ObjectStore, engine: Engine, attachment_id: uuid.UUID) -> None:
    """Wait for the worker's last step, which comes after the result is visible."""
    key = attachment_row(engine, attachment_id)["staging_key"]
    eventually(lambda: store.head(key) is None)


def broker_drained(timeout: float = 20.0) -> None:
    """Every published message was fetched and acknowledged (kombu's Redis layout)."""
    client = redis.Redis.from_url(os.environ["JOBSAPP_TEST_REDIS_URL"])

    queue = app.conf.task_default_queue

    def ours_unacked() -> int:
        # kombu keeps every channel's unacked messages in one hash: [message, exchange,
        # routing key]; another test session's leftovers there are not this test's.
        entries = client.hvals("unacked")
        return sum(1 for raw in entries if json.loads(raw)[2] == queue)

    def empty() -> bool:
        return client.llen(queue) == 0 and ours_unacked() == 0

    eventually(empty, timeout=timeout)


def stored_objects(store: ObjectStore, prefix: str) -> dict[str, Any]:
    """``key -> (sha256, modified_at)`` of what the store holds under ``prefix``."""
    found = {}
    for info in store.list(prefix):
        head = store.head(info.key)
        assert head is not None
        found[info.key] = (head.sha256, head.modified_at)
    return found


def png(size: tuple[int, int] = (120, 80)) -> bytes:
    out = io.BytesIO()
    Image.new("RGBA", size, (10, 120, 200, 128)).save(out, "PNG")
    return out.getvalue()
