"""An ObjectStore on a local directory, for development and single-host deployments.

Layout under root: `objects/<key>` holds the bytes, `meta/<key>` the content type,
`tmp/` the files being written. Keeping the three apart means no key can collide
with a temp or metadata file. The SHA-256 is recomputed from the bytes on demand,
so it cannot drift from what is on disk.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from jobsapp.storage.base import (
    ChecksumConflict,
    ChecksumMismatch,
    ObjectInfo,
    ObjectMissing,
    PutResult,
    StorageError,
    StorageUnavailable,
    normalize_sha256,
    validate_key,
    validate_prefix,
)

CHUNK_BYTES = 1024 * 1024
DEFAULT_CONTENT_TYPE = "application/octet-stream"


class LocalObjectStore:
    def __init__(self, root: Path) -> None:
        self.root = root.absolute()
        self._objects = self.root / "objects"
        self._meta = self.root / "meta"
        self._tmp = self.root / "tmp"
        for directory in (self._objects, self._meta, self._tmp):
            directory.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalObjectStore({str(self.root)!r})"

    def put_if_absent(self, key: str, data: bytes, sha256_hex: str, content_type: str) -> PutResult:
        validate_key(key)
        expected = normalize_sha256(sha256_hex)
        with _os_errors("put", key):
            tmp = self._stage(iter((data,)), expected, f"put {key!r}")
            return self._publish(tmp, key, expected, content_type)

    def get(self, key: str) -> bytes:
        return b"".join(self.open_stream(key))

    def open_stream(self, key: str) -> Iterator[bytes]:
        # Opened here rather than in the generator so a missing key raises at the call.
        with _os_errors("get", key):
            handle = _open_object(self._object_path(key), key)
        return _chunks(handle, key)

    def head(self, key: str) -> ObjectInfo | None:
        path = self._object_path(key)
        with _os_errors("head", key):
            try:
                with path.open("rb") as handle:
                    sha256 = _sha256_of(handle)
                    stat = os.fstat(handle.fileno())
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                return None
            return ObjectInfo(
                key=key,
                size=stat.st_size,
                sha256=sha256,
                content_type=self._read_content_type(key),
                modified_at=_utc(stat.st_mtime),
            )

    def copy(self, src_key: str, dst_key: str, sha256_hex: str) -> PutResult:
        validate_key(dst_key)
        expected = normalize_sha256(sha256_hex)
        with _os_errors("copy", src_key):
            try:
                source = _open_object(self._object_path(src_key), src_key)
            except ObjectMissing:
                # A re-run after the source was cleaned up still finds its earlier copy.
                if self._existing_result(dst_key, expected) is None:
                    raise
                return PutResult.ALREADY_PRESENT
            # A fresh file rather than a hard link, so the copy gets its own mtime and
            # retention does not age it from when the source was written.
            with source:
                tmp = self._stage(_chunks(source, src_key), expected, f"copy {src_key!r}")
            content_type = self._read_content_type(src_key)
            return self._publish(tmp, dst_key, expected, content_type)

    def delete(self, key: str) -> None:
        with _os_errors("delete", key):
            try:
                self._object_path(key).unlink(missing_ok=True)
            except (IsADirectoryError, NotADirectoryError):
                return
            self._meta_path(key).unlink(missing_ok=True)

    def read_url(self, key: str, expires_s: int) -> str | None:  # noqa: ARG002 - protocol
        # Files have no URL of their own: the web layer streams them with open_stream.
        validate_key(key)
        return None

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        # Validated here, not in the generator, so a bad prefix raises at the call.
        validate_prefix(prefix)
        return self._list(prefix)

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        start = self._objects / prefix.rpartition("/")[0]
        # Sorted so both backends list in the same (S3's) order.
        keys = sorted(k for k in self._walk(start) if k.startswith(prefix))
        for key in keys:
            try:
                stat = self._object_path(key).stat()
            except FileNotFoundError:
                continue  # deleted since the walk
            yield ObjectInfo(
                key=key,
                size=stat.st_size,
                sha256=None,
                content_type=None,
                modified_at=_utc(stat.st_mtime),
            )

    def _walk(self, start: Path) -> Iterator[str]:
        for directory, _dirs, files in os.walk(start):
            for name in files:
                yield (Path(directory) / name).relative_to(self._objects).as_posix()

    def _object_path(self, key: str) -> Path:
        return self._objects / validate_key(key)

    def _meta_path(self, key: str) -> Path:
        return self._meta / validate_key(key)

    def _stage(self, chunks: Iterator[bytes], sha256: str, operation: str) -> Path:
        """Write chunks to a temp file, refusing them unless they hash to sha256."""
        tmp, actual = self._write_temp(chunks)
        # The S3 server refuses a body that does not match its declared checksum;
        # refusing here gives callers the same contract on both backends.
        if actual != sha256:
            tmp.unlink()
            raise ChecksumMismatch(f"{operation}: data does not match the declared SHA-256")
        return tmp

    def _write_temp(self, chunks: Iterator[bytes]) -> tuple[Path, str]:
        """Write chunks to a fsynced temp file; return its path and SHA-256."""
        tmp = self._tmp / uuid.uuid4().hex
        digest = hashlib.sha256()
        try:
            with tmp.open("xb") as handle:
                for chunk in chunks:
                    digest.update(chunk)
                    handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp, digest.hexdigest()

    def _publish(self, tmp: Path, key: str, sha256: str, content_type: str) -> PutResult:
        """Make tmp visible at key unless something is already there."""
        path = self._object_path(key)
        try:
            _make_parents(path, key)
            # link() refuses an existing target, so two writers racing on one key
            # cannot overwrite each other: this is the local If-None-Match.
            os.link(tmp, path)
        except FileExistsError:
            return self._already_present(key, sha256)
        finally:
            tmp.unlink()
        _fsync_dir(path.parent)
        self._write_content_type(key, content_type)
        return PutResult.CREATED

    def _already_present(self, key: str, sha256: str) -> PutResult:
        existing = self._existing_result(key, sha256)
        if existing is not None:
            return existing
        if self._object_path(key).is_dir():
            raise StorageError(f"put {key!r}: the key is a directory of other objects")
        raise StorageUnavailable(f"put {key!r}: the existing object was deleted meanwhile")

    def _existing_result(self, key: str, sha256: str) -> PutResult | None:
        """ALREADY_PRESENT if key holds these bytes, None if it holds nothing."""
        info = self.head(key)
        if info is None:
            return None
        if info.sha256 != sha256:
            raise ChecksumConflict(f"{key!r} already holds an object with another SHA-256")
        if not self._meta_path(key).exists():
            # The writer crashed between publishing the bytes and their content type.
            self._write_content_type(key, DEFAULT_CONTENT_TYPE)
        return PutResult.ALREADY_PRESENT

    def _read_content_type(self, key: str) -> str:
        try:
            return self._meta_path(key).read_text(encoding="utf-8")
        except FileNotFoundError:
            return DEFAULT_CONTENT_TYPE

    def _write_content_type(self, key: str, content_type: str) -> None:
        tmp = self._write_temp(iter((content_type.encode(),)))[0]
        path = self._meta_path(key)
        _make_parents(path, key)
        os.replace(tmp, path)


@contextmanager
def _os_errors(operation: str, key: str) -> Iterator[None]:
    """Report filesystem failures through the store's own exception types."""
    try:
        yield
    except OSError as exc:
        raise StorageError(f"{operation} {key!r}: {type(exc).__name__} ({exc.strerror})") from exc


def _make_parents(path: Path, key: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        # S3 lets "a" and "a/b" coexist; a filesystem cannot.
        raise StorageError(f"{key!r}: a parent of the key is itself an object") from exc


def _open_object(path: Path, key: str) -> BinaryIO:
    try:
        return path.open("rb")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
        raise ObjectMissing(f"no object at {key!r}") from exc


def _chunks(handle: BinaryIO, key: str) -> Iterator[bytes]:
    with handle, _os_errors("read", key):
        while chunk := handle.read(CHUNK_BYTES):
            yield chunk


def _sha256_of(handle: BinaryIO) -> str:
    digest = hashlib.sha256()
    while chunk := handle.read(CHUNK_BYTES):
        digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(directory: Path) -> None:
    """Make a new directory entry durable, not just the file's bytes."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _utc(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, tz=UTC)
