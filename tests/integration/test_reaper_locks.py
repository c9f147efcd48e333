"""A domain row locked by a stuck transaction must not stop the reaper for its table.

The lock is held the way a frozen process holds it: a second session that updated the
attachment row and then went idle in its transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Connection, Engine, update

from jobsapp.attachments.models import ATTACHMENTS
from jobsapp.maintenance import reaper
from jobsapp.storage import ObjectStore
from tests.support.attachments import attachment_row, configured_store, run_rows
from tests.support.planted import running_attachment_run

REAPER = reaper.ReaperConfig(stale_after=timedelta(seconds=10))


@pytest.fixture
def local_store(tmp_path: Path) -> Iterator[ObjectStore]:
    with configured_store(f"file://{tmp_path}") as local:
        yield local


def _hold_lock(pg: Engine, attachment_id: uuid.UUID) -> Connection:
    """A session idle in transaction that holds the attachment row's lock."""
    holder = pg.connect()
    holder.begin()
    holder.execute(
        update(ATTACHMENTS).where(ATTACHMENTS.c.id == attachment_id).values(error_code=None)
    )
    return holder


def _state(pg: Engine, attachment_id: uuid.UUID) -> tuple[str, str]:
    (run,) = run_rows(pg, attachment_id)
    return run["state"], attachment_row(pg, attachment_id)["state"]


def test_a_locked_attachment_is_skipped_and_the_other_dead_runs_are_reaped(
    pg: Engine, local_store: ObjectStore
) -> None:
    # The locked run is the oldest, so it is first in every batch.
    locked, _ = running_attachment_run(pg, heartbeat_age=120)
    others = [running_attachment_run(pg, heartbeat_age=60)[0] for _ in range(3)]
    holder = _hold_lock(pg, locked)
    try:
        assert reaper.run_once(pg, REAPER)["attachments"] == 3
        for attachment_id in others:
            assert _state(pg, attachment_id) == ("queued", "queued")
        assert _state(pg, locked) == ("running", "processing")
    finally:
        holder.rollback()
        holder.close()
    # Once the stuck transaction ends, the next tick takes the skipped run.
    assert reaper.run_once(pg, REAPER)["attachments"] == 1
    assert _state(pg, locked) == ("queued", "queued")
