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

``start_backfill`` makes the same walk a lifecycle job of its own (``reprocess_runs``): its
key is the target version (one active backfill per version), and each batch's enqueues
commit together with the fenced move of its cursor and step statistics (scanned,
enqueued, skipped, failed). A killed pass is requeued by the reaper and a failed one
retaken by the domain's reconcile; either resumes from the cursor and repeats no batch.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection, Engine, func, select, update

from jobsapp.attachments.models import ATTACHMENTS, REPROCESS, REPROCESS_RUNS, RUNS, AttachmentState
from jobsapp.attachments.pipeline import get_pipeline
from jobsapp.attachments.tasks import process_attachment
from jobsapp.celery_app import app
from jobsapp.lifecycle import LeaseLost, RetryAfter, TransientError, current_run, lifecycle_task
from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.journal import EnqueueOutcome, NewJob
from jobsapp.lifecycle.journal.fence import held
from jobsapp.lifecycle.producer.enqueue import enqueue, transaction
from jobsapp.lifecycle.rules.states import State
from jobsapp.lifecycle.worker.context import RunContext

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
        return _enqueue_in(batch, ids, version)


def _enqueue_in(batch: Any, ids: list[uuid.UUID], version: int) -> list[EnqueueOutcome]:
    return [
        process_attachment.enqueue_in(
            batch, kwargs={"attachment_id": attachment_id, "pipeline_version": version}
        ).outcome
        for attachment_id in ids
    ]


# --------------------------------------------------------------------- the lifecycle job

BACKFILL_TASK = "jobsapp.attachments.reprocess"
BACKFILL_ATTEMPTS = 3


def start_backfill(
    version: int, *, batch: int = DEFAULT_BATCH, pause: float = 0.0, retry_failed: bool = False
) -> JobHandle:
    """Enqueue the backfill to ``version``; ``skipped`` when one to it is already active."""
    get_pipeline(version)
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"batch must be within 1..{MAX_BATCH}")
    params = {
        "target_version": version,
        "batch": batch,
        "pause": pause,
        "retry_failed": retry_failed,
    }
    job = NewJob(
        spec=REPROCESS_RUNS,
        job_id=uuid.uuid4(),
        task_name=BACKFILL_TASK,
        concurrency_key=f"reprocess:v{version}",
        max_attempts=BACKFILL_ATTEMPTS,
        values={
            "params": {"args": [], "kwargs": params},
            "target_version": version,
            "cursor": None,
            **dict.fromkeys(("scanned", "enqueued", "skipped", "failed"), 0),
        },
    )
    return enqueue(app, job)


@dataclass(frozen=True)
class Steps:
    """What one batch of the backfill did; ``scanned`` is always the sum of the rest."""

    enqueued: int = 0
    skipped: int = 0
    failed: int = 0

    @property
    def scanned(self) -> int:
        return self.enqueued + self.skipped + self.failed

    def __add__(self, other: Steps) -> Steps:
        return Steps(
            self.enqueued + other.enqueued, self.skipped + other.skipped, self.failed + other.failed
        )

    def describe(self) -> str:
        return (
            f"scanned {self.scanned} (enqueued {self.enqueued}, skipped {self.skipped}, "
            f"failed {self.failed})"
        )


def steps_of(outcomes: list[EnqueueOutcome], failed_before: int) -> Steps:
    enqueued = outcomes.count(EnqueueOutcome.ENQUEUED)
    return Steps(enqueued=enqueued, skipped=len(outcomes) - enqueued, failed=failed_before)


@lifecycle_task(app, name=BACKFILL_TASK, run_table=REPROCESS_RUNS, max_attempts=BACKFILL_ATTEMPTS)
def backfill(target_version: int, batch: int, pause: float, retry_failed: bool) -> None:
    ctx = current_run()
    own = ctx.row.columns
    walk = _Walk(own["cursor"], Steps(*(int(own[c]) for c in _COUNTERS)))
    try:
        while walk.step(ctx, target_version, batch, retry_failed):
            time.sleep(pause)
    except (LeaseLost, RetryAfter):
        raise
    except Exception as exc:
        # The row keeps the committed cursor and counters; the record says where it stopped.
        raise TransientError(
            f"backfill to v{target_version} stopped at cursor {walk.cursor}, "
            f"{walk.steps.describe()}"
        ) from exc


_COUNTERS = ("enqueued", "skipped", "failed")


@dataclass
class _Walk:
    """Where this attempt's backfill stands: committed cursor and counters."""

    cursor: uuid.UUID | None
    steps: Steps

    def step(self, ctx: RunContext, version: int, batch: int, retry_failed: bool) -> bool:
        """One batch, committed with the cursor's move; False when nothing is left."""
        scan = _scan(ctx.engine, version, self.cursor, batch)
        if not scan:
            return False
        with transaction(app) as tx:
            wanted = [i for i, failed in scan if retry_failed or not failed]
            steps = steps_of(_enqueue_in(tx, wanted, version), len(scan) - len(wanted))
            _advance(tx.conn, ctx, scan[-1][0], steps)
        self.cursor, self.steps = scan[-1][0], self.steps + steps
        return True


def _scan(
    engine: Engine, version: int, after: uuid.UUID | None, limit: int
) -> list[tuple[uuid.UUID, bool]]:
    """The next attachments behind ``version`` after the cursor, each with whether its job
    at ``version`` failed before."""
    stmt = select(ATTACHMENTS.c.id, _failed_at(version)).where(*_behind(version))
    if after is not None:
        stmt = stmt.where(ATTACHMENTS.c.id > after)
    with engine.connect() as conn:
        rows = conn.execute(stmt.order_by(ATTACHMENTS.c.id).limit(limit)).all()
    return [(row[0], bool(row[1])) for row in rows]


def _advance(conn: Connection, ctx: RunContext, cursor: uuid.UUID, steps: Steps) -> None:
    """Move the cursor and add the batch's steps, fenced like every write of a run."""
    c = REPROCESS.c
    moved = conn.execute(
        update(REPROCESS)
        .where(*held(REPROCESS, ctx.job_id, ctx.attempt, ctx.token))
        .values(
            cursor=cursor,
            scanned=c.scanned + steps.scanned,
            enqueued=c.enqueued + steps.enqueued,
            skipped=c.skipped + steps.skipped,
            failed=c.failed + steps.failed,
        )
    )
    if moved.rowcount != 1:
        # Rolls the batch's enqueues back with it: the run's new owner does this batch.
        raise LeaseLost(f"reprocess job {ctx.job_id} attempt {ctx.attempt} is no longer running")
