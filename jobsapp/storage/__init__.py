"""Object storage for job outputs: one small interface, a local and an S3 implementation."""

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
