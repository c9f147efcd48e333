"""Staging retention: delete staged uploads that nothing needs any more.

Policy (docs/retention.md), for each object under ``staging/``:

- no attachment row, and older than ``orphan_after`` (24 h): a crash after staging
  before the row, or a row the database refused; no row will ever name it.
- the row is ``failed``, has no active run, and was last updated more than
  ``failed_after`` (7 days) ago: past the window in which an operator replays it.
- the row is ``ready``, has no active run, and its published original is in the store
  with the upload's checksum: the worker's post-publish delete was skipped by a crash.
- anything else is kept: ``queued`` and ``processing`` work always, and a ``ready`` or
  ``failed`` attachment with a run still queued or running.

Each tick examines at most ``scan_limit`` objects. Keys are ``staging/<uuid>``, so the
pass lists one hex shard (``staging/0`` ... ``staging/f``) after another, starting where
the previous tick stopped: a backlog bigger than one tick is worked through in turns
instead of the same first page being examined every time.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from itertools import islice

from sqlalchemy import Engine, func, select

from jobsapp.attachments.models import ATTACHMENTS, RUNS, AttachmentState
from jobsapp.attachments.store import STAGING_PREFIX
from jobsapp.db import utcnow
from jobsapp.lifecycle.rules.states import ACTIVE_STATES
from jobsapp.storage import ObjectInfo, ObjectStore, StorageError

log = logging.getLogger(__name__)

SHARDS = "0123456789abcdef"


@dataclass(frozen=True)
class StagingConfig:
    orphan_after: timedelta = timedelta(hours=24)
    failed_after: timedelta = timedelta(days=7)
    # Objects examined per tick (listed, looked up, maybe deleted): beat runs the passes
    # one after another, so one tick must stay short even when all of them are deleted.
    scan_limit: int = 2000
    # Objects per database lookup.
    batch: int = 500

    def __post_init__(self) -> None:
        if self.orphan_after <= timedelta(0) or self.failed_after <= timedelta(0):
            raise ValueError("staging retention needs positive orphan and failed windows")
        if self.scan_limit < 1 or self.batch < 1:
            raise ValueError("staging retention needs a positive scan limit and batch")


class Reason(StrEnum):
    ORPHAN = "orphan"
    FAILED = "failed"
    PUBLISHED = "published"


@dataclass(frozen=True)
class StagedRow:
    """What the database says about the attachment a staging object belongs to."""

    state: str
    updated_at: datetime
    active_runs: int
    # Only looked up for a ready attachment with no active run: the one case that needs it.
    original_intact: bool = False


# --- the decision (pure) ----------------------------------------------------------------


def verdict(
    obj: ObjectInfo, row: StagedRow | None, now: datetime, cfg: StagingConfig
) -> Reason | None:
    """Why ``obj`` may be deleted, or None to keep it."""
    if row is None:
        return Reason.ORPHAN if obj.modified_at < now - cfg.orphan_after else None
    if row.active_runs:
        return None
    if row.state == AttachmentState.FAILED.value and row.updated_at < now - cfg.failed_after:
        return Reason.FAILED
    if row.state == AttachmentState.READY.value and row.original_intact:
        return Reason.PUBLISHED
    return None


def doomed(
    objects: Iterable[ObjectInfo],
    rows: Mapping[str, StagedRow],
    now: datetime,
    cfg: StagingConfig,
) -> list[tuple[ObjectInfo, Reason]]:
    """The objects to delete and why; ``rows`` is keyed by staging key."""
    found = ((obj, verdict(obj, rows.get(obj.key), now, cfg)) for obj in objects)
    return [(obj, reason) for obj, reason in found if reason is not None]


def needs_original_check(row: StagedRow) -> bool:
    """Only a ready attachment with no active run can lose its staging to ``published``."""
    return row.state == AttachmentState.READY.value and not row.active_runs


def attachment_id_of(key: str) -> uuid.UUID | None:
    """The attachment a staging key was made for, or None for a key jobsapp never makes."""
    try:
        return uuid.UUID(key.removeprefix(STAGING_PREFIX))
    except ValueError:
        return None


# --- the pass ---------------------------------------------------------------------------


@dataclass
class StagingReport:
    counts: dict[str, int] = field(
        default_factory=lambda: (
            {"examined": 0, "kept": 0, "errors": 0} | {reason.value: 0 for reason in Reason}
        )
    )
    # Where the next tick starts listing.
    next_shard: int = 0

    @property
    def deleted(self) -> int:
        return sum(self.counts[reason.value] for reason in Reason)


def run_once(
    engine: Engine, store: ObjectStore, cfg: StagingConfig, *, start_shard: int = 0
) -> StagingReport:
    """One bounded pass; ``start_shard`` is the previous report's ``next_shard``."""
    report = StagingReport(next_shard=start_shard % len(SHARDS))
    for step in range(len(SHARDS)):
        shard = (start_shard + step) % len(SHARDS)
        budget = cfg.scan_limit - report.counts["examined"]
        if budget <= 0:
            break
        listed = list(islice(store.list(f"{STAGING_PREFIX}{SHARDS[shard]}"), budget))
        for chunk in _chunks(listed, cfg.batch):
            _sweep(engine, store, chunk, cfg, report)
        report.next_shard = (shard + 1) % len(SHARDS)
    level = logging.INFO if report.deleted or report.counts["errors"] else logging.DEBUG
    log.log(level, "staging retention: %s", report.counts)
    return report


def _chunks(items: Sequence[ObjectInfo], size: int) -> Iterable[Sequence[ObjectInfo]]:
    return (items[i : i + size] for i in range(0, len(items), size))


def _sweep(
    engine: Engine,
    store: ObjectStore,
    objects: Sequence[ObjectInfo],
    cfg: StagingConfig,
    report: StagingReport,
) -> None:
    rows = _with_original_checked(store, _rows(engine, objects))
    gone = doomed(objects, rows, utcnow(), cfg)
    report.counts["examined"] += len(objects)
    report.counts["kept"] += len(objects) - len(gone)
    for obj, reason in gone:
        try:
            store.delete(obj.key)
        except StorageError as exc:
            # The object stays and is judged again next tick.
            log.warning("staging object %s not deleted: %s", obj.key, exc)
            report.counts["errors"] += 1
            continue
        report.counts[reason.value] += 1


@dataclass(frozen=True)
class _Found:
    row: StagedRow
    original_key: str | None
    sha256: str


def _rows(engine: Engine, objects: Sequence[ObjectInfo]) -> dict[str, _Found]:
    """Rows naming these staging keys, with their count of active runs."""
    ids = [i for i in (attachment_id_of(obj.key) for obj in objects) if i is not None]
    if not ids:
        return {}
    active = (
        select(func.count())
        .select_from(RUNS)
        .where(RUNS.c.attachment_id == ATTACHMENTS.c.id, RUNS.c.state.in_(ACTIVE_STATES))
        .scalar_subquery()
    )
    stmt = select(
        ATTACHMENTS.c.staging_key,
        ATTACHMENTS.c.state,
        ATTACHMENTS.c.updated_at,
        ATTACHMENTS.c.original_key,
        ATTACHMENTS.c.sha256,
        active.label("active"),
    ).where(ATTACHMENTS.c.id.in_(ids))
    with engine.connect() as conn:
        found = conn.execute(stmt).all()
    return {
        r.staging_key: _Found(StagedRow(r.state, r.updated_at, r.active), r.original_key, r.sha256)
        for r in found
    }


def _with_original_checked(store: ObjectStore, found: dict[str, _Found]) -> dict[str, StagedRow]:
    # Staging may be the last copy of an upload: delete it only once the published
    # original is really there, with the checksum accepted at upload.
    rows: dict[str, StagedRow] = {}
    for key, item in found.items():
        row = item.row
        if needs_original_check(row) and item.original_key is not None:
            info = store.head(item.original_key)
            intact = info is not None and info.sha256 == item.sha256
            row = StagedRow(row.state, row.updated_at, row.active_runs, intact)
        rows[key] = row
    return rows
