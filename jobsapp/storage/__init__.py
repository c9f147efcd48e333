"""Object storage for job outputs: one small interface, a local and an S3 implementation.

The S3 names are imported on first use: boto3 takes ~0.2 s to import, and a process on a
local store never needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobsapp.storage.base import (
    ChecksumConflict,
    ChecksumMismatch,
    ObjectInfo,
    ObjectMissing,
    ObjectStore,
    PutResult,
    StorageError,
    StorageUnavailable,
)
from jobsapp.storage.factory import store_from_url
from jobsapp.storage.local import LocalObjectStore

if TYPE_CHECKING:
    from jobsapp.storage.s3 import S3ObjectStore, make_s3_client

__all__ = [
    "ChecksumConflict",
    "ChecksumMismatch",
    "LocalObjectStore",
    "ObjectInfo",
    "ObjectMissing",
    "ObjectStore",
    "PutResult",
    "S3ObjectStore",
    "StorageError",
    "StorageUnavailable",
    "make_s3_client",
    "store_from_url",
]


def __getattr__(name: str) -> Any:
    if name in ("S3ObjectStore", "make_s3_client"):
        from jobsapp.storage import s3

        return getattr(s3, name)
    raise AttributeError(f"module 'jobsapp.storage' has no attribute {name!r}")
