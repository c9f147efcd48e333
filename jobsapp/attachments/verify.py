"""Cross-check published attachments against the object store, and repair the drift.

``verify`` checks every ``ready`` attachment: each variant its published version promises
has a row, and each row's object and the original are in the store with the recorded
SHA-256 (the checksum the store kept at write time; ``deep`` downloads and hashes the
bytes instead). It then lists the objects under ``attachments/`` and reports those no row
names (orphans). An unnamed object of an attachment with a run still queued or running
is work in flight (written before its COMMIT), not drift. ``staging/`` is retention's.

``repair`` goes through the normal lifecycle, never around it: it deletes orphans and
corrupt objects (each re-checked first, so a fix made meanwhile is kept), then enqueues
the published version's job again for every attachment with a missing or corrupt
variant. The job's id is derived from ``(attachment, version)``: its finished run is
reopened as a new attempt, which finds the effect incomplete (the task checks objects,
not only rows) and writes the variants again. A missing or corrupt original cannot be
rebuilt from anything we keep: it is reported as unrepairable.

An orphan is deleted by moving it to a tombstone (``verify-trash/<key>``), then asking
the database again: a publish that adopted the object between the first check and the
delete (a replay whose worker found it stored) shows as a row naming the key or a run
still active, and the object is copied back from its tombstone. Only then does the
tombstone go. A repair that dies in between leaves tombstones; the next repair settles
them first, the same way.

A worker whose encoder differs from the one that first rendered (another Pillow or
libwebp build) writes other bytes, and the task keeps an existing variant row as it is.
Once a re-run job succeeded, ``record_rewritten`` makes each of its variant rows describe
the object now under its key, so the next verify is clean instead of reporting the new
bytes as corrupt forever.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import islice
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, select, tuple_, update

from jobsapp.attachments.models import ATTACHMENTS, RUNS, VARIANTS, AttachmentState
from jobsapp.attachments.pipeline import PIPELINES
from jobsapp.attachments.store import PUBLISHED_PREFIX
from jobsapp.attachments.tasks import process_attachment
from jobsapp.celery_app import app
from jobsapp.lifecycle.producer.enqueue import transaction
from jobsapp.lifecycle.rules.states import ACTIVE_STATES, is_terminal
from jobsapp.storage import (
    ChecksumConflict,
    ChecksumMismatch,
    ObjectInfo,
    ObjectMissing,
    ObjectStore,
    PutResult,
)

ORIGINAL = "original"
# What ``observe`` reports for bytes the store itself refuses to serve (checksum failure).
UNREADABLE = "unreadable"
DEFAULT_BATCH = 200
# Outside ``attachments/`` (verify's) and ``staging/`` (retention's).
TOMBSTONE_PREFIX = "verify-trash"
_T = TypeVar("_T")


class Kind(StrEnum):
    MISSING = "missing"
    CORRUPT = "corrupt"
    # A variant the published version promises has no row at all.
    NO_ROW = "no_row"


@dataclass(frozen=True)
class Expected:
    """An object a published attachment needs: its key and the recorded SHA-256."""

    attachment_id: uuid.UUID
    version: int
    name: str
    key: str
    sha256: str


@dataclass(frozen=True)
class Problem:
    attachment_id: uuid.UUID
    version: int
    name: str
    kind: Kind
    key: str | None = None
    recorded: str | None = None
    found: str | None = None

    def line(self) -> str:
        where = self.key or "(no row)"
        text = f"{self.kind.value.upper():8} {self.attachment_id} v{self.version} {self.name}"
        text += f": {where}"
        if self.kind is Kind.CORRUPT:
            text += f" (sha256 {self.found}, recorded {self.recorded})"
        return text


@dataclass
class Report:
    attachments: int = 0
    objects: int = 0
    problems: list[Problem] = field(default_factory=list)
    orphans: list[ObjectInfo] = field(default_factory=list)
    in_flight: int = 0

    @property
    def clean(self) -> bool:
        return not self.problems and not self.orphans


# --- decisions (pure) -------------------------------------------------------------------


def expected_of(
    row: Mapping[str, Any], variants: Sequence[Mapping[str, Any]]
) -> tuple[list[Expected], list[Problem]]:
    """What a ready attachment must have in the store, and the promised rows it lacks."""
    attachment_id, version = row["id"], int(row["published_version"])
    expected = [Expected(attachment_id, version, ORIGINAL, row["original_key"], row["sha256"])]
    by_name = {v["variant"]: v for v in variants}
    # A version this build does not know promises at least the rows it has.
    known = PIPELINES.get(version)
    promised = [s.name for s in known.variants] if known is not None else sorted(by_name)
    problems = []
    for name in promised:
        found = by_name.get(name)
        if found is None:
            problems.append(Problem(attachment_id, version, name, Kind.NO_ROW))
        else:
            expected.append(
                Expected(attachment_id, version, name, found["object_key"], found["sha256"])
            )
    return expected, problems


def judge(item: Expected, found: str | None) -> Problem | None:
    """``found`` is the stored object's SHA-256, or None when there is no object."""
    if found is None:
        return Problem(
            item.attachment_id, item.version, item.name, Kind.MISSING, item.key, item.sha256
        )
    if found != item.sha256:
        return Problem(
            item.attachment_id, item.version, item.name, Kind.CORRUPT, item.key, item.sha256, found
        )
    return None


def owner_of(key: str) -> uuid.UUID | None:
    """The attachment a published key belongs to (``attachments/<uuid>/...``), if any."""
    parts = key.split("/")
    if len(parts) < 3 or parts[0] != PUBLISHED_PREFIX:
        return None
    try:
        return uuid.UUID(parts[1])
    except ValueError:
        return None


def orphans_among(
    listed: Iterable[ObjectInfo], named: set[str], busy: set[uuid.UUID]
) -> tuple[list[ObjectInfo], int]:
    """Objects no row names, and how many unnamed ones belong to work in flight."""
    orphans, in_flight = [], 0
    for obj in listed:
        if obj.key in named:
            continue
        if owner_of(obj.key) in busy:
            in_flight += 1
        else:
            orphans.append(obj)
    return orphans, in_flight


def wanted(key: str, named: set[str], busy: set[uuid.UUID]) -> bool:
    """A row names the key, or a run of its attachment may still adopt it."""
    return key in named or owner_of(key) in busy


def tombstone_of(key: str) -> str:
    return f"{TOMBSTONE_PREFIX}/{key}"


@dataclass(frozen=True)
class RepairPlan:
    # attachment -> the published version whose job runs again
    reruns: dict[uuid.UUID, int]
    # corrupt objects to delete first, so the conditional write can put them again
    corrupt: list[Problem]
    orphans: list[ObjectInfo]
    unrepairable: list[Problem]


def plan_repair(report: Report) -> RepairPlan:
    by_attachment: dict[uuid.UUID, list[Problem]] = defaultdict(list)
    for problem in report.problems:
        by_attachment[problem.attachment_id].append(problem)
    reruns: dict[uuid.UUID, int] = {}
    corrupt: list[Problem] = []
    unrepairable: list[Problem] = []
    for attachment_id, problems in by_attachment.items():
        version = problems[0].version
        # The job renders from the original: without it, or without the version's
        # recipe in this build, a re-run could only fail.
        if any(p.name == ORIGINAL for p in problems) or version not in PIPELINES:
            unrepairable += problems
            continue
        reruns[attachment_id] = version
        corrupt += [p for p in problems if p.kind is Kind.CORRUPT]
    return RepairPlan(reruns, corrupt, list(report.orphans), unrepairable)


@dataclass(frozen=True)
class Rewrite:
    """A variant row to make describe the object now stored under its key."""

    attachment_id: uuid.UUID
    version: int
    name: str
    key: str
    recorded: str
    sha256: str
    size: int


def rewrites_of(
    rows: Iterable[Mapping[str, Any]], stored: Mapping[str, ObjectInfo | None]
) -> list[Rewrite]:
    """The rows whose object, by the store's checksum, holds other bytes than recorded."""
    found = []
    for row in rows:
        info = stored.get(row["object_key"])
        if info is None or info.sha256 is None or info.sha256 == row["sha256"]:
            continue
        found.append(
            Rewrite(
                row["attachment_id"],
                int(row["pipeline_version"]),
                row["variant"],
                row["object_key"],
                row["sha256"],
                info.sha256,
                info.size,
            )
        )
    return found


# --- reading the store ------------------------------------------------------------------


def observe(store: ObjectStore, key: str, *, deep: bool = False) -> str | None:
    """The SHA-256 of what the store holds at ``key``, or None if nothing."""
    info = store.head(key)
    if info is None:
        return None
    if not deep and info.sha256 is not None:
        return info.sha256
    # Deep, or an object written without a recorded checksum: hash the bytes.
    try:
        data = store.get(key)
    except ObjectMissing:
        return None
    except ChecksumMismatch:
        return UNREADABLE
    return hashlib.sha256(data).hexdigest()


# --- verify -----------------------------------------------------------------------------


def verify(
    engine: Engine, store: ObjectStore, *, deep: bool = False, batch: int = DEFAULT_BATCH
) -> Report:
    """Check every ready attachment, then look for orphans; reads only."""
    report = Report()
    for rows, variants in _ready_batches(engine, batch):
        for row in rows:
            _check_attachment(store, row, variants.get(row["id"], []), deep, report)
    for listed in _chunks(store.list(f"{PUBLISHED_PREFIX}/"), batch):
        with engine.connect() as conn:
            named, busy = _references(conn, [o.key for o in listed])
        orphans, in_flight = orphans_among(listed, named, busy)
        report.orphans += orphans
        report.in_flight += in_flight
    return report


def _check_attachment(
    store: ObjectStore,
    row: Mapping[str, Any],
    variants: Sequence[Mapping[str, Any]],
    deep: bool,
    report: Report,
) -> None:
    expected, problems = expected_of(row, variants)
    report.attachments += 1
    report.objects += len(expected)
    report.problems += problems
    for item in expected:
        problem = judge(item, observe(store, item.key, deep=deep))
        if problem is not None:
            report.problems.append(problem)


def _ready_batches(
    engine: Engine, size: int
) -> Iterator[tuple[list[dict[str, Any]], dict[uuid.UUID, list[dict[str, Any]]]]]:
    """Ready attachments by id, a batch at a time, with their published version's rows."""
    after: uuid.UUID | None = None
    while True:
        stmt = select(ATTACHMENTS).where(ATTACHMENTS.c.state == AttachmentState.READY.value)
        if after is not None:
            stmt = stmt.where(ATTACHMENTS.c.id > after)
        with engine.connect() as conn:
            rows = [
                dict(r)
                for r in conn.execute(stmt.order_by(ATTACHMENTS.c.id).limit(size)).mappings()
            ]
            if not rows:
                return
            variants = _published_rows(conn, rows)
        yield rows, variants
        after = rows[-1]["id"]


def _published_rows(
    conn: Connection, rows: Sequence[Mapping[str, Any]]
) -> dict[uuid.UUID, list[dict[str, Any]]]:
    pairs = [(r["id"], r["published_version"]) for r in rows]
    stmt = select(VARIANTS).where(
        tuple_(VARIANTS.c.attachment_id, VARIANTS.c.pipeline_version).in_(pairs)
    )
    found: dict[uuid.UUID, list[dict[str, Any]]] = defaultdict(list)
    for variant in conn.execute(stmt).mappings():
        found[variant["attachment_id"]].append(dict(variant))
    return found


def _references(conn: Connection, keys: Sequence[str]) -> tuple[set[str], set[uuid.UUID]]:
    """Keys that rows of the keys' attachments name, and which of those are busy."""
    ids = list({i for i in (owner_of(k) for k in keys) if i is not None})
    if not ids:
        return set(), set()
    named = set(
        conn.execute(
            select(VARIANTS.c.object_key).where(VARIANTS.c.attachment_id.in_(ids))
        ).scalars()
    )
    named |= set(
        conn.execute(
            select(ATTACHMENTS.c.original_key).where(
                ATTACHMENTS.c.id.in_(ids), ATTACHMENTS.c.original_key.is_not(None)
            )
        ).scalars()
    )
    busy = set(
        conn.execute(
            select(RUNS.c.attachment_id).where(
                RUNS.c.attachment_id.in_(ids), RUNS.c.state.in_(ACTIVE_STATES)
            )
        ).scalars()
    )
    return named, busy


def _chunks(items: Iterable[_T], size: int) -> Iterator[list[_T]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


# --- repair -----------------------------------------------------------------------------


@dataclass
class RepairResult:
    orphans_deleted: int = 0
    # Orphans put back: a publish adopted them while they were being deleted.
    orphans_restored: int = 0
    corrupt_deleted: int = 0
    # job id -> attachment, for every job the repair waits for
    jobs: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)


def repair(
    engine: Engine, store: ObjectStore, plan: RepairPlan, *, batch: int = DEFAULT_BATCH
) -> RepairResult:
    """Carry out ``plan``: deletions first, so a re-run never adopts what is deleted next."""
    result = RepairResult()
    leftovers = (
        o.key.removeprefix(f"{TOMBSTONE_PREFIX}/") for o in store.list(f"{TOMBSTONE_PREFIX}/")
    )
    for keys in _chunks(leftovers, batch):
        result.orphans_restored += _settle(engine, store, keys)
    for chunk in _chunks(plan.orphans, batch):
        buried = _bury_orphans(engine, store, chunk)
        restored = _settle(engine, store, buried)
        result.orphans_deleted += len(buried) - restored
        result.orphans_restored += restored
    result.corrupt_deleted = sum(_delete_corrupt(store, p) for p in plan.corrupt)
    reruns = list(plan.reruns.items())
    for start in range(0, len(reruns), batch):
        result.jobs |= _rerun(reruns[start : start + batch])
    return result


def _bury_orphans(engine: Engine, store: ObjectStore, listed: Sequence[ObjectInfo]) -> list[str]:
    """Move the still unreferenced objects to their tombstones; the keys moved."""
    # Judged again now: a run may have started, or committed a row naming the key.
    with engine.connect() as conn:
        named, busy = _references(conn, [o.key for o in listed])
    orphans, _ = orphans_among(listed, named, busy)
    return [obj.key for obj in orphans if _bury(store, obj.key)]


def _bury(store: ObjectStore, key: str) -> bool:
    info = store.head(key)
    if info is None:
        return False
    tombstone = tombstone_of(key)
    try:
        if info.sha256 is not None:
            store.copy(key, tombstone, info.sha256)
        else:
            # Not written by jobsapp: no recorded checksum for a server-side copy to keep.
            data = store.get(key)
            store.put_if_absent(
                tombstone,
                data,
                hashlib.sha256(data).hexdigest(),
                info.content_type or "application/octet-stream",
            )
    except ObjectMissing:
        # Deleted since the HEAD (another repair): nothing left to bury.
        return False
    store.delete(key)
    return True


def _settle(engine: Engine, store: ObjectStore, keys: Sequence[str]) -> int:
    """Put back what a publish adopted meanwhile, then drop the tombstones; how many back."""
    if not keys:
        return 0
    # Asked after the deletes: a publish that saw an object before its delete has, by
    # now, either a run still active or its committed rows.
    with engine.connect() as conn:
        named, busy = _references(conn, keys)
    restored = 0
    for key in keys:
        if wanted(key, named, busy):
            restored += _restore(store, key)
        store.delete(tombstone_of(key))
    return restored


def _restore(store: ObjectStore, key: str) -> int:
    tombstone = tombstone_of(key)
    info = store.head(tombstone)
    if info is None:
        # Another repair settled it meanwhile.
        return 0
    if info.sha256 is None:
        # Never so when _bury wrote it; refused rather than guessed, the tombstone stays.
        raise ChecksumMismatch(f"tombstone {tombstone!r} has no recorded SHA-256")
    try:
        created = store.copy(tombstone, key, info.sha256) is PutResult.CREATED
    except ChecksumConflict:
        # The publish found the key empty and wrote its own rendering: that one stays.
        return 0
    return int(created)


def _delete_corrupt(store: ObjectStore, problem: Problem) -> int:
    assert problem.key is not None
    found = observe(store, problem.key)
    # Gone already, or fixed meanwhile: nothing to delete.
    if found is None or found == problem.recorded:
        return 0
    store.delete(problem.key)
    return 1


def _rerun(reruns: Sequence[tuple[uuid.UUID, int]]) -> dict[uuid.UUID, uuid.UUID]:
    """Enqueue the jobs in one transaction; job id -> attachment of each to wait for."""
    jobs: dict[uuid.UUID, uuid.UUID] = {}
    with transaction(app) as batch:
        for attachment_id, version in reruns:
            handle = process_attachment.enqueue_in(
                batch, kwargs={"attachment_id": attachment_id, "pipeline_version": version}
            )
            # Skipped: another job holds the version's key; it does the work, wait for it.
            jobs[handle.holder or handle.job_id] = attachment_id
    return jobs


def record_rewritten(
    engine: Engine,
    store: ObjectStore,
    reruns: Mapping[uuid.UUID, int],
    jobs: Mapping[uuid.UUID, uuid.UUID],
    states: Mapping[uuid.UUID, str],
) -> int:
    """Make the rows of every re-run that succeeded describe what it stored; rows changed.

    Only a succeeded re-run's objects are taken as truth: its worker rendered them from
    the verified original (or found them stored and accepted them) and committed. A
    forged object nothing re-rendered stays a corrupt one.
    """
    done = [(a, reruns[a]) for job_id, a in jobs.items() if states.get(job_id) == "succeeded"]
    if not done:
        return 0
    with engine.connect() as conn:
        rows = [
            dict(r)
            for r in conn.execute(
                select(VARIANTS).where(
                    tuple_(VARIANTS.c.attachment_id, VARIANTS.c.pipeline_version).in_(done)
                )
            ).mappings()
        ]
    stored = {row["object_key"]: store.head(row["object_key"]) for row in rows}
    with engine.begin() as conn:
        return sum(_rewrite(conn, item) for item in rewrites_of(rows, stored))


def _rewrite(conn: Connection, item: Rewrite) -> int:
    # Compare-and-set on the key and the recorded checksum: a row changed meanwhile is
    # left to the next verify.
    stmt = (
        update(VARIANTS)
        .where(
            VARIANTS.c.attachment_id == item.attachment_id,
            VARIANTS.c.pipeline_version == item.version,
            VARIANTS.c.variant == item.name,
            VARIANTS.c.object_key == item.key,
            VARIANTS.c.sha256 == item.recorded,
        )
        .values(sha256=item.sha256, size=item.size)
    )
    return int(conn.execute(stmt).rowcount)


def wait_for(
    engine: Engine,
    job_ids: Iterable[uuid.UUID],
    *,
    timeout: float,
    interval: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
) -> dict[uuid.UUID, str]:
    """The state of each job once all are terminal, or at the deadline."""
    ids = list(job_ids)
    deadline = clock() + timeout
    while True:
        with engine.connect() as conn:
            found = conn.execute(select(RUNS.c.job_id, RUNS.c.state).where(RUNS.c.job_id.in_(ids)))
            states: dict[uuid.UUID, str] = {r.job_id: r.state for r in found}
        # A job with no row (its run pruned by retention) has nothing left to wait for.
        if all(is_terminal(states.get(i, "succeeded")) for i in ids) or clock() > deadline:
            return {i: states.get(i, "gone") for i in ids}
        time.sleep(interval)
