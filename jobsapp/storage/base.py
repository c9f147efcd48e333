"""The object-store contract shared by the local and S3 implementations.

Writes are conditional (never overwrite) and carry the SHA-256 of the bytes, so a
job that re-runs after a crash finds its own earlier write and counts it as done,
while a different object under the same key is reported instead of clobbered.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

MAX_KEY_BYTES = 1024  # S3's limit; the local store keeps to it so both accept the same keys
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class PutResult(StrEnum):
    CREATED = "created"
    ALREADY_PRESENT = "already_present"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a store knows about one object.

    `sha256` and `content_type` are None from `list()` (S3 listings do not carry
    them and fetching them would cost a request per object), and `sha256` is None
    from `head()` only for an object this code did not write.
    """

    key: str
    size: int
    sha256: str | None
    content_type: str | None
    modified_at: datetime  # aware, UTC


class StorageError(Exception):
    """A storage operation failed; messages never carry credentials or signed URLs."""


class StorageUnavailable(StorageError):
    """The store could not be reached or answered 5xx: worth retrying later."""


class ObjectMissing(StorageError):
    """No object exists at the key."""


class ChecksumConflict(StorageError):
    """A different object (another SHA-256) already exists at the key."""


class ChecksumMismatch(StorageError):
    """The bytes do not match the SHA-256 they were declared with."""


class ObjectStore(Protocol):
    def put_if_absent(
        self, key: str, data: bytes, sha256_hex: str, content_type: str
    ) -> PutResult: ...

    def get(self, key: str) -> bytes: ...

    def open_stream(self, key: str) -> Iterator[bytes]:
        """Chunks of the object; raises ObjectMissing before the first chunk."""
        ...

    def head(self, key: str) -> ObjectInfo | None: ...

    def copy(self, src_key: str, dst_key: str, sha256_hex: str) -> PutResult:
        """Conditional like put_if_absent; the source must hash to sha256_hex."""
        ...

    def delete(self, key: str) -> None: ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Objects whose key starts with prefix, in key order."""
        ...

    def read_url(self, key: str, expires_s: int) -> str | None:
        """A URL a client can GET the object from, or None: serve open_stream instead."""
        ...


def validate_key(key: str) -> str:
    """Reject keys that could escape a root directory or mean different things per backend."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise ValueError(f"invalid object key {key!r}")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise ValueError(f"object key longer than {MAX_KEY_BYTES} bytes: {key[:64]!r}...")
    if any(segment in ("", ".", "..") for segment in key.split("/")):
        raise ValueError(f"invalid object key {key!r}")
    return key


def validate_prefix(prefix: str) -> str:
    """A listing prefix is empty or a key, optionally ending in '/'."""
    if prefix:
        validate_key(prefix.removesuffix("/"))
    return prefix


def normalize_sha256(sha256_hex: str) -> str:
    digest = sha256_hex.lower()
    if not _SHA256_HEX.fullmatch(digest):
        raise ValueError(f"not a SHA-256 hex digest: {sha256_hex!r}")
    return digest
