"""Build the configured ObjectStore from a URL such as `s3://bucket/prefix` or `file:///srv/x`."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import SplitResult, unquote, urlsplit

from jobsapp.storage.base import ObjectStore
from jobsapp.storage.local import LocalObjectStore


def store_from_url(
    url: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    public_url: str | None = None,
) -> ObjectStore:
    """`s3://bucket[/prefix]`, `file:///absolute/path` or `file:relative/path`.

    endpoint_url, region and public_url (the endpoint browsers reach, for presigned read
    URLs) apply to s3 URLs only; credentials come from AWS_*.
    """
    parts = urlsplit(url)
    if _plain(parts):
        if parts.scheme == "s3" and parts.netloc:
            # Not at the top: a process on a local store never imports boto3 (see the package).
            from jobsapp.storage.s3 import S3ObjectStore, make_s3_client

            prefix = unquote(parts.path).strip("/")
            client = make_s3_client(endpoint_url, region)
            public = make_s3_client(public_url, region) if public_url else None
            return S3ObjectStore(parts.netloc, prefix, client, public_client=public)
        if parts.scheme == "file" and parts.netloc in ("", "localhost") and parts.path:
            return LocalObjectStore(Path(unquote(parts.path)))
    raise ValueError(
        f"unsupported storage URL {_redacted(url, parts)!r}: "
        "expected s3://bucket/prefix or file:///path (or file:relative/path)"
    )


def _plain(parts: SplitResult) -> bool:
    # Credentials belong in AWS_* variables, never in a URL that gets logged.
    return not (parts.query or parts.fragment or parts.username or parts.password or parts.port)


def _redacted(url: str, parts: SplitResult) -> str:
    if parts.username or parts.password:
        return parts._replace(netloc="***@" + (parts.hostname or "")).geturl()
    return url
