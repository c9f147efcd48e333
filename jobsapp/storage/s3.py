"""An ObjectStore on an S3 bucket (AWS or a compatible server such as SeaweedFS).

Every write is conditional (`If-None-Match: *`) and carries `x-amz-checksum-sha256`,
so the server itself refuses both overwrites and corrupted bodies. The digest is
also kept as `x-amz-meta-sha256` for servers that do not echo checksums on HEAD.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import UTC
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.response import StreamingBody

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

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client
    from types_boto3_s3.type_defs import HeadObjectOutputTypeDef

SHA256_METADATA = "sha256"
CHUNK_BYTES = 1024 * 1024
MAX_PRESIGN_S = 7 * 24 * 3600  # SigV4 refuses longer
# Fail fast when the server is down: the job layer owns the longer retry schedule.
CONNECT_TIMEOUT_S = 3
READ_TIMEOUT_S = 10
MAX_ATTEMPTS = 3

_MISSING_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_DIGEST_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"})
# 409: a concurrent conditional write on the same key; retrying resolves it.
_TRANSIENT_CODES = frozenset({"SlowDown", "RequestTimeout", "ConditionalRequestConflict"})
_TRANSIENT_ERRORS = (BotoConnectionError, HTTPClientError, IncompleteReadError)


class _PreconditionFailed(StorageError):
    """412 on a conditional write; put and copy turn it into a PutResult."""


def make_s3_client(endpoint_url: str | None, region: str | None) -> S3Client:
    """A client configured from the standard AWS_* environment for credentials."""
    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"mode": "standard", "total_max_attempts": MAX_ATTEMPTS},
        # Compatible servers on a bare host:port have no per-bucket DNS names.
        s3={"addressing_style": "path" if endpoint_url else "auto"},
        # botocore presigns with SigV2 on a custom endpoint unless told; V2 is deprecated
        # and refused by AWS regions opened since 2014 and by current MinIO.
        signature_version="s3v4",
    )
    session = boto3.session.Session(region_name=region)
    return session.client("s3", endpoint_url=endpoint_url, config=config)


class S3ObjectStore:
    def __init__(
        self,
        bucket: str,
        prefix: str,
        client: S3Client,
        *,
        page_size: int = 1000,
        public_client: S3Client | None = None,
    ) -> None:
        """``public_client`` signs read URLs for the address browsers use, when the
        servers reach S3 under an internal host name (``http://minio:9000``)."""
        validate_prefix(prefix)
        self.bucket = bucket
        # The prefix acts as a directory whether or not it was written with a slash.
        self.prefix = prefix.rstrip("/") + "/" if prefix else ""
        self.page_size = page_size
        self._client = client
        self._public_client = public_client or client

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.bucket!r}, {self.prefix!r})"

    def put_if_absent(self, key: str, data: bytes, sha256_hex: str, content_type: str) -> PutResult:
        expected = normalize_sha256(sha256_hex)
        try:
            with _translated("put", key):
                self._client.put_object(
                    Bucket=self.bucket,
                    Key=self._full_key(key),
                    Body=data,
                    ContentType=content_type,
                    IfNoneMatch="*",
                    ChecksumSHA256=_b64(expected),
                    Metadata={SHA256_METADATA: expected},
                )
        except _PreconditionFailed:
            return self._existing_result(key, expected, "put")
        return PutResult.CREATED

    def get(self, key: str) -> bytes:
        return b"".join(self.open_stream(key))

    def open_stream(self, key: str) -> Iterator[bytes]:
        with _translated("get", key):
            # ChecksumMode makes botocore verify the body against the stored SHA-256.
            response = self._client.get_object(
                Bucket=self.bucket, Key=self._full_key(key), ChecksumMode="ENABLED"
            )
        return _streamed(response["Body"], key)

    def head(self, key: str) -> ObjectInfo | None:
        try:
            with _translated("head", key):
                response = self._client.head_object(
                    Bucket=self.bucket, Key=self._full_key(key), ChecksumMode="ENABLED"
                )
        except ObjectMissing:
            return None
        return ObjectInfo(
            key=key,
            size=response["ContentLength"],
            sha256=_sha256_from(response),
            content_type=response.get("ContentType"),
            modified_at=response["LastModified"].astimezone(UTC),
        )

    def copy(self, src_key: str, dst_key: str, sha256_hex: str) -> PutResult:
        expected = normalize_sha256(sha256_hex)
        source = self.head(src_key)
        if source is None:
            # A re-run after the source was cleaned up still finds its earlier copy.
            return self._existing_result(dst_key, expected, "copy", missing=src_key)
        if source.sha256 != expected:
            raise ChecksumMismatch(f"copy {src_key!r}: source does not match the SHA-256")
        try:
            with _translated("copy", dst_key):
                # COPY keeps the source's content type, sha256 metadata and checksum.
                self._client.copy_object(
                    Bucket=self.bucket,
                    Key=self._full_key(dst_key),
                    CopySource={"Bucket": self.bucket, "Key": self._full_key(src_key)},
                    MetadataDirective="COPY",
                    IfNoneMatch="*",
                )
        except _PreconditionFailed:
            return self._existing_result(dst_key, expected, "copy")
        return PutResult.CREATED

    def delete(self, key: str) -> None:
        # S3 answers 204 for a missing key too, which is the idempotence we want.
        with _translated("delete", key):
            self._client.delete_object(Bucket=self.bucket, Key=self._full_key(key))

    def read_url(self, key: str, expires_s: int) -> str | None:
        if not 0 < expires_s <= MAX_PRESIGN_S:
            raise ValueError(f"expires_s must be within 1..{MAX_PRESIGN_S}, got {expires_s}")
        # SigV4 signs the host: the URL must name the one the browser will send.
        return self._public_client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": self._full_key(key)},
            ExpiresIn=expires_s,
        )

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        # Validated here, not in the generator, so a bad prefix raises at the call.
        validate_prefix(prefix)
        return self._list(prefix)

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket,
            Prefix=self.prefix + prefix,
            PaginationConfig={"PageSize": self.page_size},
        )
        with _translated("list", prefix):
            for page in pages:
                for item in page.get("Contents", []):
                    yield ObjectInfo(
                        key=item["Key"].removeprefix(self.prefix),
                        size=item["Size"],
                        sha256=None,
                        content_type=None,
                        modified_at=item["LastModified"].astimezone(UTC),
                    )

    def _full_key(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def _existing_result(
        self, key: str, sha256: str, operation: str, *, missing: str | None = None
    ) -> PutResult:
        """ALREADY_PRESENT if key holds an object with this SHA-256."""
        existing = self.head(key)
        if existing is None and missing is not None:
            raise ObjectMissing(f"{operation}: no object at {missing!r}")
        if existing is None:
            # 412 said it existed, so it was deleted in between: a retry will write it.
            raise StorageUnavailable(f"{operation} {key!r}: the existing object vanished")
        if existing.sha256 != sha256:
            raise ChecksumConflict(f"{key!r} already holds an object with another SHA-256")
        return PutResult.ALREADY_PRESENT


def _sha256_from(response: HeadObjectOutputTypeDef) -> str | None:
    """Prefer the checksum the server verified; fall back to the metadata we wrote."""
    checksum = response.get("ChecksumSHA256", "")
    # A multipart upload's composite checksum ("...-N") is not the object's digest.
    if checksum and "-" not in checksum:
        try:
            return base64.b64decode(checksum, validate=True).hex()
        except binascii.Error:
            pass
    return response.get("Metadata", {}).get(SHA256_METADATA)


def _b64(sha256_hex: str) -> str:
    return base64.b64encode(bytes.fromhex(sha256_hex)).decode("ascii")


def _streamed(body: StreamingBody, key: str) -> Iterator[bytes]:
    # closing() returns the connection to the pool even if the reader stops early.
    with closing(body), _translated("get", key):
        yield from body.iter_chunks(CHUNK_BYTES)


@contextmanager
def _translated(operation: str, key: str) -> Iterator[None]:
    """Map botocore failures to the store's exceptions.

    Messages name the operation, key and error code only: botocore's own text can
    carry request URLs, and a presigned URL's query string is a credential.
    """
    try:
        yield
    except ClientError as exc:
        raise _from_client_error(operation, key, exc) from exc
    except FlexibleChecksumError as exc:
        raise ChecksumMismatch(f"{operation} {key!r}: body failed checksum validation") from exc
    except _TRANSIENT_ERRORS as exc:
        raise StorageUnavailable(f"{operation} {key!r}: {type(exc).__name__}") from exc
    except BotoCoreError as exc:
        raise StorageError(f"{operation} {key!r}: {type(exc).__name__}") from exc


def _from_client_error(operation: str, key: str, exc: ClientError) -> StorageError:
    code = exc.response.get("Error", {}).get("Code", "")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    message = f"{operation} {key!r}: {code or 'error'} (HTTP {status})"
    if code == "PreconditionFailed" or status == 412:
        return _PreconditionFailed(message)
    if code in _MISSING_CODES:
        return ObjectMissing(message)
    if code in _DIGEST_CODES:
        return ChecksumMismatch(message)
    if code in _TRANSIENT_CODES or status >= 500:
        return StorageUnavailable(message)
    return StorageError(message)
