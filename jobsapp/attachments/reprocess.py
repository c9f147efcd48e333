"""Re-processing ready attachments to a newer pipeline version.

``reprocess_to`` walks the ``ready`` attachments still published at an older version in
batches ordered by id, and enqueues ``process_attachment`` at the target version for each,
one transaction per batch (journal and outbox rows; published after COMMIT). Job ids are
derived from ``(attachment, version)``, so running it again (after Ctrl-C, a crash, or
just twice) finds the jobs it already made: queued or running ones answer duplicate, and
finished ones no longer match (their attachment moved to the new version). An attachment
keeps serving its published version while the new one is rendered: the worker never takes
``ready`` back, and ``published_version`` only moves up.

An attachment whose job at the target version already failed is left out unless asked
for: running it again is an operator's decision, not a side effect of a bulk command.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Engine, func, select

from jobsapp.attachments.models import ATTACHMENTS, RUNS, AttachmentState
from jobsapp.attachments.pipeline import get_pipeline
from jobsapp.attachments.tasks import process_attachment
from jobsapp.celery_app import app
from jobsapp.lifecycle.enqueue import transaction
from jobsapp.lifecycle.journal import EnqueueOutcome
from jobsapp.lifecycle.states import State

DEFAULT_BATCH = 100
MAX_BATCH = 10_000


@dataclass(frozen=True)
class Progress:
    """Where a reprocess stands; ``total`` is counted once, at the start."""

    version: int
    total: int
    enqueued: int = 0
    # Their job at this version is already queued or running (an earlier, interrupted run).
    in_flight: int = 0
    # Another job with the same concurrency key is active (a foreign producer's).
    busy: int = 0
    # Left out: their job at this version failed before (see ``retry_failed``).
    failed_before: int = 0

    @property
    def seen(self) -> int:
        return self.enqueued + self.in_flight + self.busy

    def counted(self, outcomes: list[EnqueueOutcome]) -> Progress:
        """This progress plus one batch's enqueue outcomes."""
        return replace(
            self,
            enqueued=self.enqueued + outcomes.count(EnqueueOutcome.ENQUEUED),
            in_flight=self.in_flight + outcomes.count(EnqueueOutcome.DUPLICATE),
            busy=self.busy + outcomes.count(EnqueueOutcome.SKIPPED),
        )


ProgressCallback = Callable[[Progress], None]


def reprocess_to(
    engine: Engine,
    version: int,
    *,
    batch: int = DEFAULT_BATCH,
    progress: ProgressCallback | None = None,
    retry_failed: bool = False,
    pause: float = 0.0,
) -> Progress:
    """Enqueue the version's job for every ready attachment published at an older one.

    ``progress`` is called after each committed batch; ``pause`` seconds between batches
    keep a large backlog from crowding out fresh uploads on the same workers. Raises
    ``UnknownPipeline`` for a version this build does not have. Safe to interrupt: a batch
    is one transaction, and whatever it committed is published after COMMIT or, if the
    process died in between, by the outbox relay.
    """
    get_pipeline(version)
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"batch must be within 1..{MAX_BATCH}")
    state = _start(engine, version, retry_failed)
    after: uuid.UUID | None = None
    while True:
        ids = _next_batch(engine, version, after, batch, retry_failed)
        if not ids:
            return state
        if after is not None and pause > 0:
            time.sleep(pause)
        state = state.counted(_enqueue(ids, version))
        after = ids[-1]
        if progress is not None:
            progress(state)


def _behind(version: int) -> Any:
    """Ready attachments published at an older version than ``version``."""
    return (
        ATTACHMENTS.c.state == AttachmentState.READY.value,
        ATTACHMENTS.c.published_version < version,
    )


def _failed_at(version: int) -> Any:
    return (
        select(RUNS.c.job_id)
        .where(
            RUNS.c.attachment_id == ATTACHMENTS.c.id,
            RUNS.c.pipeline_version == version,
            RUNS.c.state == State.FAILED.value,
        )
        .exists()
    )


def _start(engine: Engine, version: int, retry_failed: bool) -> Progress:
    count = select(func.count()).select_from(ATTACHMENTS).where(*_behind(version))
    with engine.connect() as conn:
        behind = int(conn.execute(count).scalar_one())
        failed = 0
        if not retry_failed:
            failed = int(conn.execute(count.where(_failed_at(version))).scalar_one())
    return Progress(version=version, total=behind - failed, failed_before=failed)


def _next_batch(
    engine: Engine, version: int, after: uuid.UUID | None, limit: int, retry_failed: bool
) -> list[uuid.UUID]:
    # Keyset by id: each attachment is visited once per run, even though the ones already
    # enqueued still match until their new version is published.
    stmt = select(ATTACHMENTS.c.id).where(*_behind(version))
    if not retry_failed:
        stmt = stmt.where(~_failed_at(version))
    if after is not None:
        stmt = stmt.where(ATTACHMENTS.c.id > after)
    with engine.connect() as conn:
        return list(conn.execute(stmt.order_by(ATTACHMENTS.c.id).limit(limit)).scalars())


def _enqueue(ids: list[uuid.UUID], version: int) -> list[EnqueueOutcome]:
    with transaction(app) as batch:
        handles = [
            process_attachment.enqueue_in(
                batch, kwargs={"attachment_id": attachment_id, "pipeline_version": version}
            )
            for attachment_id in ids
        ]
    return [handle.outcome for handle in handles]
