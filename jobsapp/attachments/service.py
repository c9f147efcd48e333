"""The attachment service the web app calls: accept an upload, show it, open a variant.

``accept_upload`` answers only after a durable handoff: the whole validated original is in
staging, and the attachment row, its run row and the outbox message committed together.
Errors a client can fix raise ``RejectedUpload`` (with its HTTP status); storage or the
database being unreachable raises ``ServiceUnavailable`` (503, try again).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from jobsapp import crashpoints
from jobsapp.attachments.models import ATTACHMENTS, VARIANTS, AttachmentState
from jobsapp.attachments.pipeline import PIPELINES
from jobsapp.attachments.store import get_store, staging_key
from jobsapp.attachments.tasks import process_attachment
from jobsapp.attachments.validation import (
    DEFAULT_LIMITS,
    ImageInfo,
    Limits,
    RejectedUpload,
    inspect_upload,
    sanitize_display_name,
)
from jobsapp.celery_app import app
from jobsapp.db import get_engine, utcnow
from jobsapp.lifecycle.producer.enqueue import transaction
from jobsapp.storage import ObjectMissing, StorageError

__all__ = [
    "UPLOAD_PIPELINE_VERSION",
    "Accepted",
    "RejectedUpload",
    "ServiceUnavailable",
    "VariantMissing",
    "VariantRead",
    "accept_upload",
    "get_attachment",
    "open_variant",
]

# New uploads are rendered with version 1 (docs/domains.md, "The attachments domain");
# later versions are reached by re-processing.
UPLOAD_PIPELINE_VERSION = 1
MAX_IDEMPOTENCY_KEY = 255
DEFAULT_URL_EXPIRY_S = 300
# What "the database is down" looks like; an IntegrityError or a bad query is a bug, not 503.
_DB_DOWN = (OperationalError, InterfaceError, PoolTimeout)

log = logging.getLogger(__name__)


class ServiceUnavailable(Exception):
    """Storage or the database cannot be reached now: answer 503, the client retries."""


class VariantMissing(Exception):
    """A published variant whose object storage no longer has: no retry brings it back
    (an operator's ``jobsapp verify`` names it, ``jobsapp reprocess`` makes it again)."""


@dataclass(frozen=True)
class Accepted:
    """The answer to an upload: the attachment, its state, and whether this call made it."""

    attachment_id: uuid.UUID
    state: str
    created: bool


@dataclass(frozen=True)
class VariantRead:
    """How to serve a variant: a presigned ``url`` (S3), or a ``stream`` of its bytes."""

    content_type: str
    size: int
    sha256: str
    url: str | None = None
    stream: Iterator[bytes] | None = None


@contextmanager
def _available() -> Iterator[None]:
    try:
        yield
    except _DB_DOWN as exc:
        raise ServiceUnavailable(f"database unavailable: {type(exc).__name__}") from exc
    except StorageError as exc:
        raise ServiceUnavailable(f"storage unavailable: {type(exc).__name__}") from exc


# --- upload -----------------------------------------------------------------------------


def accept_upload(
    data: bytes,
    filename: str | None,
    idempotency_key: str | None,
    *,
    limits: Limits = DEFAULT_LIMITS,
) -> Accepted:
    """Validate, stage, and record an upload with its processing job; see the module doc.

    The same ``idempotency_key`` returns the first attachment (``created=False``); reused
    for a different file it is refused (422, ``idempotency_key_reused``).
    """
    info = inspect_upload(data, limits)
    key = _checked_idempotency_key(idempotency_key)
    if key is not None:
        with _available(), get_engine().connect() as conn:
            existing = _by_idempotency_key(conn, key)
        if existing is not None:
            return _replayed(existing, info)
    attachment_id = uuid.uuid4()
    staged = staging_key(attachment_id)
    with _available():
        get_store().put_if_absent(staged, data, info.sha256, info.content_type)
    crashpoints.hit("after_staging")
    # From here a crash or a database failure leaves a staging object without a row:
    # deleting those is retention's job (issue 6), not this request's.
    row = _new_row(attachment_id, staged, info, sanitize_display_name(filename), key)
    with _available():
        winner = _record(row)
    if winner is None:
        return Accepted(attachment_id, AttachmentState.QUEUED.value, created=True)
    _forget_staging(staged)
    return _replayed(winner, info)


def _checked_idempotency_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not 0 < len(key) <= MAX_IDEMPOTENCY_KEY or not key.isascii() or not key.isprintable():
        raise RejectedUpload(
            400,
            "bad_idempotency_key",
            f"The Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY} printable ASCII characters.",
        )
    return key


def _by_idempotency_key(conn: Connection, key: str) -> Mapping[str, Any] | None:
    return _first(conn, select(ATTACHMENTS).where(ATTACHMENTS.c.idempotency_key == key))


def _first(conn: Connection, stmt: Any) -> dict[str, Any] | None:
    row = conn.execute(stmt).mappings().first()
    return None if row is None else dict(row)


def _replayed(existing: Mapping[str, Any], info: ImageInfo) -> Accepted:
    # A key names one request; the same key with another file is a client bug, and
    # answering with the first file's attachment would hide it.
    if existing["sha256"] != info.sha256:
        raise RejectedUpload(
            422,
            "idempotency_key_reused",
            "This Idempotency-Key was already used for a different file.",
        )
    return Accepted(existing["id"], existing["state"], created=False)


def _new_row(
    attachment_id: uuid.UUID, staged: str, info: ImageInfo, display_name: str, key: str | None
) -> dict[str, Any]:
    now = utcnow()
    return {
        "id": attachment_id,
        "content_type": info.content_type,
        "size": info.size,
        "sha256": info.sha256,
        "width": info.width,
        "height": info.height,
        "display_name": display_name,
        "staging_key": staged,
        "original_key": None,
        "state": AttachmentState.QUEUED.value,
        "published_version": None,
        "error_code": None,
        "idempotency_key": key,
        "created_at": now,
        "updated_at": now,
    }


def _record(row: dict[str, Any]) -> Mapping[str, Any] | None:
    """Insert the row and enqueue its job in one transaction; None, or a twin that won."""
    with transaction(app) as batch:
        dialect_insert = pg_insert if batch.conn.dialect.name == "postgresql" else sqlite_insert
        stmt = (
            dialect_insert(ATTACHMENTS)
            .values(row)
            # A concurrent request with the same key committed first: it is the answer.
            .on_conflict_do_nothing(index_elements=[ATTACHMENTS.c.idempotency_key])
            .returning(ATTACHMENTS.c.id)
        )
        if batch.conn.execute(stmt).first() is None:
            winner = _by_idempotency_key(batch.conn, row["idempotency_key"])
            if winner is None:
                raise ServiceUnavailable("idempotency conflict without a winner; retry")
            return winner
        process_attachment.enqueue_in(
            batch, kwargs={"attachment_id": row["id"], "pipeline_version": UPLOAD_PIPELINE_VERSION}
        )
    return None


def _forget_staging(key: str) -> None:
    # This request's own object, which no row names: nothing else can depend on it. If
    # the delete fails, retention removes staging objects without a row.
    with suppress(StorageError):
        get_store().delete(key)


# --- reading ----------------------------------------------------------------------------


def get_attachment(attachment_id: uuid.UUID) -> dict[str, Any] | None:
    """A JSON-ready view of the attachment and its published variants, or None."""
    with _available(), get_engine().connect() as conn:
        row = _first(conn, select(ATTACHMENTS).where(ATTACHMENTS.c.id == attachment_id))
        if row is None:
            return None
        variants = _published_variants(conn, row)
    return _view(row, variants)


def _published_variants(conn: Connection, row: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    version = row["published_version"]
    if version is None:
        return []
    stmt = select(VARIANTS).where(
        VARIANTS.c.attachment_id == row["id"], VARIANTS.c.pipeline_version == version
    )
    found = [dict(v) for v in conn.execute(stmt).mappings()]
    # In the order the pipeline declares them (thumbnail first), not the table's.
    order = [spec.name for spec in PIPELINES[version].variants] if version in PIPELINES else []
    return sorted(
        found,
        key=lambda v: (
            order.index(v["variant"]) if v["variant"] in order else len(order),
            v["variant"],
        ),
    )


def _view(row: Mapping[str, Any], variants: list[Mapping[str, Any]]) -> dict[str, Any]:
    fields = (
        "state",
        "content_type",
        "size",
        "sha256",
        "width",
        "height",
        "display_name",
        "published_version",
        "error_code",
    )
    original = None
    if row["original_key"] is not None:
        original = {"object_key": row["original_key"], "sha256": row["sha256"], "size": row["size"]}
    return {
        "id": str(row["id"]),
        **{name: row[name] for name in fields},
        "created_at": row["created_at"].isoformat(),
        "updated_at": row["updated_at"].isoformat(),
        "variants": [_variant_view(v) for v in variants],
        "original": original,
    }


def _variant_view(v: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": v["variant"],
        "pipeline_version": v["pipeline_version"],
        "object_key": v["object_key"],
        "sha256": v["sha256"],
        "size": v["size"],
        "width": v["width"],
        "height": v["height"],
        "content_type": v["content_type"],
    }


def open_variant(
    attachment_id: uuid.UUID, name: str, *, expires_s: int = DEFAULT_URL_EXPIRY_S
) -> VariantRead | None:
    """How to serve a published variant, or None if the attachment has no such variant.

    Only variants are served: the original keeps the client's EXIF (GPS included).
    """
    stmt = (
        select(VARIANTS)
        .join(ATTACHMENTS, ATTACHMENTS.c.id == VARIANTS.c.attachment_id)
        .where(
            VARIANTS.c.attachment_id == attachment_id,
            VARIANTS.c.variant == name,
            VARIANTS.c.pipeline_version == ATTACHMENTS.c.published_version,
        )
    )
    with _available(), get_engine().connect() as conn:
        variant = _first(conn, stmt)
    if variant is None:
        return None
    read = VariantRead(variant["content_type"], variant["size"], variant["sha256"])
    store, key = get_store(), variant["object_key"]
    with _available():
        url = store.read_url(key, expires_s)
        if url is not None:
            return VariantRead(read.content_type, read.size, read.sha256, url=url)
        try:
            stream = store.open_stream(key)
        except ObjectMissing:
            log.error(
                "attachment %s: published variant %s has no object at %s", attachment_id, name, key
            )
            raise VariantMissing(f"{attachment_id} {name}") from None
        return VariantRead(read.content_type, read.size, read.sha256, stream=stream)
