"""``process_attachment``: render every variant a pipeline version promises and publish it.

The message carries ids only; everything else (the staging key, the checksum, the
content type) is read from the attachment row. Objects are written before the database
result, each conditionally at a deterministic key, so a crash anywhere leaves either
nothing visible or objects that the next attempt finds and counts as done. The result
(variant rows, ``ready``, ``published_version``) commits in the same transaction as the
run's fenced ``succeeded``; staging is deleted only after that commit.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Update, func, or_, select, update
from sqlalchemy.exc import DBAPIError

from jobsapp import crashpoints
from jobsapp.attachments.models import ATTACHMENT_RUNS, ATTACHMENTS, RUNS, VARIANTS, AttachmentState
from jobsapp.attachments.pipeline import (
    CorruptImage,
    ImageTooLarge,
    PipelineError,
    RenderedVariant,
    get_pipeline,
    original_key,
    render_all,
    variant_key,
)
from jobsapp.attachments.store import PUBLISHED_PREFIX, get_store
from jobsapp.attachments.validation import CONTENT_TYPES, EXTENSIONS
from jobsapp.celery_app import app
from jobsapp.db import utcnow
from jobsapp.lifecycle import (
    LeaseLost,
    LifecycleTask,
    PermanentError,
    RetryAfter,
    RunContext,
    TransientError,
    current_run,
    journal,
    lifecycle_task,
)
from jobsapp.lifecycle.journal.fence import held
from jobsapp.lifecycle.rules.scrub import describe_exception, known_secrets_from_env
from jobsapp.lifecycle.rules.states import ACTIVE_STATES, Outcome
from jobsapp.settings import get_settings
from jobsapp.storage import (
    ChecksumConflict,
    ChecksumMismatch,
    ObjectMissing,
    ObjectStore,
    StorageError,
    StorageUnavailable,
)

log = logging.getLogger(__name__)

TASK_NAME = "jobsapp.attachments.process"
# Job ids are derived from (attachment, version): enqueueing the same work twice is one job.
_JOB_NAMESPACE = uuid.UUID("9b0f7d0c-5a43-4a52-8f3e-2b7c1c6e0a11")
_FORMAT_OF_TYPE = {content_type: fmt for fmt, content_type in CONTENT_TYPES.items()}
_ID_FIELDS = frozenset({"attachment_id", "pipeline_version"})
# A failure never takes a published attachment back (a failed reprocess keeps it ready).
_UNFINISHED = (AttachmentState.QUEUED, AttachmentState.PROCESSING)


class AttachmentFailed(PermanentError):
    """Processing cannot succeed; the attachment ends ``failed`` with ``error_code``."""


def coerce_ids(values: Mapping[str, Any]) -> dict[str, Any]:
    """The run's ids as the table stores them; a message carries them as JSON strings."""
    if set(values) != _ID_FIELDS:
        raise TypeError(f"attachment jobs take exactly {sorted(_ID_FIELDS)}, not {sorted(values)}")
    version = values["pipeline_version"]
    # bool is an int to Python, and a float would be truncated silently.
    if isinstance(version, bool) or not isinstance(version, int | str):
        raise TypeError("pipeline_version must be an integer")
    number = int(version)
    if number < 1:
        raise ValueError("pipeline versions start at 1")
    return {"attachment_id": uuid.UUID(str(values["attachment_id"])), "pipeline_version": number}


class AttachmentTask(LifecycleTask):
    """Ids arrive as strings from a message and as UUID/int from Python producers."""

    def row_values(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        if args:
            raise TypeError(f"{self.name} takes keyword ids only")
        return coerce_ids(kwargs)

    def derive_job_id(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> uuid.UUID:
        ids = self.row_values(args, kwargs)
        return uuid.uuid5(_JOB_NAMESPACE, f"{ids['attachment_id']}:v{ids['pipeline_version']}")

    def concurrency_key(self, job_id: uuid.UUID, values: Mapping[str, Any]) -> str:  # noqa: ARG002
        # Canonical spelling whatever the producer passed, or the index would not exclude.
        ids = coerce_ids(values)
        return f"attachment:{ids['attachment_id']}:v{ids['pipeline_version']}"


@dataclass(frozen=True)
class _Job:
    ctx: RunContext
    attachment_id: uuid.UUID
    version: int

    @property
    def last_attempt(self) -> bool:
        return self.ctx.attempt >= self.ctx.row.max_attempts


@dataclass(frozen=True)
class _Stored:
    """A variant as it sits in the store, ready to become its row."""

    name: str
    key: str
    sha256: str
    size: int
    rendered: RenderedVariant


@lifecycle_task(
    app,
    base=AttachmentTask,
    name=TASK_NAME,
    run_table=ATTACHMENT_RUNS,
    max_attempts=5,
    # The body turns these into AttachmentFailed itself; listed so that one escaping the
    # body is still never retried.
    permanent_errors=(CorruptImage, ImageTooLarge),
)
def process_attachment(attachment_id: uuid.UUID, pipeline_version: int) -> None:
    job = _Job(current_run(), attachment_id, pipeline_version)
    with _attachment_settled(job):
        _publish(job)
        _drop_staging(job)


def _publish(job: _Job) -> None:
    """Render, store and commit the version's variants, unless that is already done."""
    store = get_store()
    with job.ctx.engine.connect() as conn:
        row = _load(conn, job.attachment_id)
        if row is None:
            raise AttachmentFailed("the attachment row is gone", error_code="attachment_missing")
        names = {spec.name for spec in get_pipeline(job.version).variants}
        published = _published_objects(conn, row, job.version, names)
    if published is not None and all(_intact(store, key, sha) for key, sha in published):
        log.info("attachment %s v%s is already published", job.attachment_id, job.version)
        return
    _mark_processing(job)
    source = _read_source(job, store, row)
    rendered = render_all(source, job.version, get_settings().image_memory_budget)
    stored = [_put_variant(store, job, name, variant) for name, variant in rendered.items()]
    original = _ensure_original(store, job, row)
    job.ctx.check_lease()
    crashpoints.hit("after_s3_write_before_commit")
    _commit(job, stored, original)
    crashpoints.hit("after_result_commit_before_ack")


# --- reading ----------------------------------------------------------------------------


def _load(conn: Connection, attachment_id: uuid.UUID) -> Mapping[str, Any] | None:
    stmt = select(ATTACHMENTS).where(ATTACHMENTS.c.id == attachment_id)
    row = conn.execute(stmt).mappings().first()
    return None if row is None else dict(row)


def _published_objects(
    conn: Connection, row: Mapping[str, Any], version: int, names: set[str]
) -> list[tuple[str, str]] | None:
    """``(key, sha256)`` of the version's complete effect, or None if a row is missing.

    A redelivered or re-run job whose effect is complete is acknowledged with no change,
    but only once the objects are checked too (docs/domains.md): ``jobsapp verify --repair``
    deletes a lost or corrupt variant's object and re-runs the job to write it again.
    """
    published = row["published_version"]
    if published is None or published < version or row["original_key"] is None:
        return None
    stmt = select(VARIANTS.c.variant, VARIANTS.c.object_key, VARIANTS.c.sha256).where(
        VARIANTS.c.attachment_id == row["id"], VARIANTS.c.pipeline_version == version
    )
    found = {r.variant: (r.object_key, r.sha256) for r in conn.execute(stmt)}
    if not names <= set(found):
        return None
    return [found[name] for name in sorted(names)] + [(row["original_key"], row["sha256"])]


def _intact(store: ObjectStore, key: str, sha256: str) -> bool:
    # One HEAD per object: the checksum the store kept at write time. An object with no
    # recorded checksum (not written by jobsapp) is trusted here; ``verify --deep`` hashes it.
    info = store.head(key)
    return info is not None and info.sha256 in (None, sha256)


def _read_source(job: _Job, store: ObjectStore, row: Mapping[str, Any]) -> bytes:
    """The upload's bytes, verified against the checksum recorded when it was accepted."""
    if row["original_key"] is not None:
        return _read_verified(store, row["original_key"], row["sha256"], "original")
    try:
        return _read_verified(store, row["staging_key"], row["sha256"], "staging")
    except ObjectMissing:
        pass
    # Another version's run may have published the original and dropped staging since
    # the row was read.
    with job.ctx.engine.connect() as conn:
        fresh = _load(conn, job.attachment_id)
    if fresh is None or fresh["original_key"] is None:
        raise AttachmentFailed("the staged upload is gone", error_code="staging_missing")
    return _read_verified(store, fresh["original_key"], row["sha256"], "original")


def _read_verified(store: ObjectStore, key: str, sha256: str, kind: str) -> bytes:
    try:
        data = store.get(key)
    except ObjectMissing:
        if kind == "staging":
            raise
        raise AttachmentFailed(f"the {kind} object is gone", error_code=f"{kind}_missing") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise AttachmentFailed(
            f"the {kind} object does not match the accepted upload's SHA-256",
            error_code=f"{kind}_checksum",
        )
    return data


# --- writing objects --------------------------------------------------------------------


def _put_variant(store: ObjectStore, job: _Job, name: str, variant: RenderedVariant) -> _Stored:
    key = variant_key(PUBLISHED_PREFIX, job.attachment_id, job.version, name)
    try:
        # ALREADY_PRESENT (an earlier attempt wrote the same bytes) counts as done.
        store.put_if_absent(key, variant.data, variant.sha256, variant.content_type)
    except ChecksumConflict:
        return _adopt(store, key, name, variant)
    return _Stored(name, key, variant.sha256, len(variant.data), variant)


def _adopt(store: ObjectStore, key: str, name: str, variant: RenderedVariant) -> _Stored:
    # An attempt on a build with another encoder wrote different bytes here. They are as
    # valid a rendering, a committed row may already name them, and keys are never
    # overwritten: keep them, and describe what is actually stored.
    info = store.head(key)
    if info is None or info.sha256 is None:
        raise StorageUnavailable(f"{key!r} changed while it was being published")
    log.warning("variant %s kept as stored (sha256 %s), not as rendered", key, info.sha256)
    return _Stored(name, key, info.sha256, info.size, variant)


def _ensure_original(store: ObjectStore, job: _Job, row: Mapping[str, Any]) -> str:
    """The permanent key of the upload, copied from staging unless already published."""
    if row["original_key"] is not None:
        return str(row["original_key"])
    fmt = _FORMAT_OF_TYPE.get(row["content_type"])
    if fmt is None:
        raise AttachmentFailed("unknown stored content type", error_code="unsupported_format")
    key = original_key(PUBLISHED_PREFIX, job.attachment_id, EXTENSIONS[fmt])
    try:
        store.copy(row["staging_key"], key, row["sha256"])
    except ChecksumMismatch as bad:
        raise AttachmentFailed(str(bad), error_code="staging_checksum") from bad
    return key


# --- database writes --------------------------------------------------------------------


def _holds_lease(job: _Job) -> ColumnElement[bool]:
    """Attachment writes outside ``completing()`` are fenced like the run's own writes: a
    revoke's stop request refuses them too."""
    ctx = job.ctx
    return select(RUNS.c.job_id).where(*held(RUNS, ctx.job_id, ctx.attempt, ctx.token)).exists()


def _attachment_update(job: _Job, from_states: Sequence[AttachmentState], **values: Any) -> Update:
    return (
        update(ATTACHMENTS)
        .where(
            ATTACHMENTS.c.id == job.attachment_id,
            ATTACHMENTS.c.state.in_([s.value for s in from_states]),
        )
        .values(**values, updated_at=utcnow())
    )


def _set_state(job: _Job, from_states: Sequence[AttachmentState], **values: Any) -> None:
    with job.ctx.engine.begin() as conn:
        conn.execute(_attachment_update(job, from_states, **values).where(_holds_lease(job)))


def _mark_processing(job: _Job) -> None:
    # Never from ready: reprocessing a ready attachment to a newer version keeps serving
    # the published one. From failed: an operator's replay is wanted work.
    _set_state(
        job,
        (AttachmentState.QUEUED, AttachmentState.FAILED),
        state=AttachmentState.PROCESSING.value,
        error_code=None,
    )


def _commit(job: _Job, stored: Sequence[_Stored], original: str) -> None:
    """Variant rows, ``ready`` and the run's ``succeeded``: one transaction, fenced first."""
    now = utcnow()
    rows = [_variant_row(job, item, now) for item in stored]
    with job.ctx.completing() as conn:
        insert = journal.upsert(conn, VARIANTS).values(rows)
        conn.execute(insert.on_conflict_do_nothing(index_elements=list(VARIANTS.primary_key)))
        conn.execute(
            update(ATTACHMENTS)
            .where(
                ATTACHMENTS.c.id == job.attachment_id,
                # An older version finishing late never replaces a newer one.
                or_(
                    ATTACHMENTS.c.published_version.is_(None),
                    ATTACHMENTS.c.published_version <= job.version,
                ),
            )
            .values(
                state=AttachmentState.READY.value,
                published_version=job.version,
                original_key=original,
                error_code=None,
                updated_at=now,
            )
        )


def _variant_row(job: _Job, item: _Stored, now: datetime) -> dict[str, Any]:
    return {
        "attachment_id": job.attachment_id,
        "pipeline_version": job.version,
        "variant": item.name,
        "object_key": item.key,
        "sha256": item.sha256,
        "size": item.size,
        "width": item.rendered.width,
        "height": item.rendered.height,
        "content_type": item.rendered.content_type,
        "created_at": now,
    }


# --- after the commit -------------------------------------------------------------------


def _drop_staging(job: _Job) -> None:
    """Delete the staged upload once the original is published and no run still needs it.

    A run enqueued after the check reads the published original instead, so the check and
    the delete need no lock. Never raises: the run has succeeded. A staging object left
    behind is retention's.
    """
    try:
        with job.ctx.engine.connect() as conn:
            row = _load(conn, job.attachment_id)
            others = conn.execute(
                select(func.count())
                .select_from(RUNS)
                .where(
                    RUNS.c.attachment_id == job.attachment_id,
                    RUNS.c.state.in_(ACTIVE_STATES),
                    RUNS.c.job_id != job.ctx.job_id,
                )
            ).scalar_one()
        if row is None or row["original_key"] is None or others:
            return
        get_store().delete(row["staging_key"])
    except Exception as exc:  # noqa: BLE001 - the result is committed; this is tidying
        log.warning("staging of attachment %s not deleted: %s", job.attachment_id, exc)


# --- failures ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Verdict:
    permanent: bool
    error_code: str


def classify(exc: Exception) -> _Verdict:
    """Whether retrying can help, and the code a client and an operator see."""
    if isinstance(exc, PermanentError):
        return _Verdict(True, exc.error_code)
    if isinstance(exc, PipelineError):
        return _Verdict(exc.permanent, exc.error_code)
    if isinstance(exc, StorageUnavailable):
        return _Verdict(False, "storage_unavailable")
    if isinstance(exc, StorageError):
        return _Verdict(False, "storage_error")
    if isinstance(exc, DBAPIError):
        return _Verdict(False, "database_error")
    return _Verdict(False, "internal_error")


@contextmanager
def _attachment_settled(job: _Job) -> Iterator[None]:
    """Mirror the run's fate on the attachment.

    Permanent, or transient on the last attempt: the run ends ``failed`` and the attachment
    ``failed`` with ``error_code`` in one transaction, written here rather than by the
    engine, so a crash or a lost connection can never leave one without the other.
    Transient with attempts left: back to ``queued`` (docs/domains.md: processing -> queued), and
    the engine requeues the run.
    """
    try:
        yield
    except (LeaseLost, RetryAfter):
        # A run taken from us writes nothing; a pause changes nothing a client sees.
        raise
    except Exception as exc:
        verdict = classify(exc)
        failure = _as_lifecycle_error(exc, verdict)
        if verdict.permanent or job.last_attempt:
            _fail_together(job, failure, verdict)
            return
        _record(job, (AttachmentState.PROCESSING,), state=AttachmentState.QUEUED.value)
        if failure is exc:
            raise
        raise failure from exc


def _as_lifecycle_error(exc: Exception, verdict: _Verdict) -> Exception:
    if isinstance(exc, PermanentError | TransientError):
        return exc
    failed: Exception
    if verdict.permanent:
        failed = AttachmentFailed(str(exc), error_code=verdict.error_code)
    else:
        failed = TransientError(verdict.error_code)
    failed.__cause__ = exc
    return failed


def _fail_together(job: _Job, failure: Exception, verdict: _Verdict) -> None:
    """The run's ``failed`` (fenced) and the attachment's ``failed``: one transaction."""
    outcome = Outcome.PERMANENT if verdict.permanent else Outcome.EXHAUSTED
    error = f"[{verdict.error_code}] " + describe_exception(
        failure, secrets=known_secrets_from_env(os.environ)
    )
    ctx = job.ctx
    try:
        # The run's fenced ``failed`` first: in this transaction it is no longer running.
        # Celery and Flower then show the attempt FAILURE with ``failure``.
        with ctx.failing(failure, outcome=outcome, said=error) as conn:
            conn.execute(
                _attachment_update(
                    job,
                    _UNFINISHED,
                    state=AttachmentState.FAILED.value,
                    error_code=verdict.error_code,
                )
            )
            crashpoints.hit("after_attachment_failed_before_run_outcome")
    except DBAPIError as down:
        # Written together or not at all: the run stays running, its heartbeat stops with
        # this attempt, and the reaper settles it (and the attachment with it).
        raise LeaseLost(f"job {ctx.job_id}: failure not recorded: {type(down).__name__}") from None


def _record(job: _Job, from_states: Sequence[AttachmentState], **values: Any) -> None:
    try:
        _set_state(job, from_states, **values)
    except Exception as exc:  # noqa: BLE001 - the engine still records the run's outcome
        log.warning("attachment %s state not recorded: %s", job.attachment_id, exc)
