"""Presigned variant URLs name the public S3 endpoint and are signed with SigV4.

The servers reach SeaweedFS as 127.0.0.1, "the browser" as localhost: two host names for
one server, as ``minio:9000`` inside compose and ``localhost:9000`` outside it.
"""

from __future__ import annotations

import hashlib
import urllib.request
import uuid
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest

from jobsapp.attachments.store import clear_store_cache
from jobsapp.storage import ObjectStore
from tests.support.attachments import configured_store, environment
from tests.support.env import service


@pytest.fixture
def public_s3() -> Iterator[tuple[ObjectStore, str]]:
    internal = service("JOBSAPP_TEST_S3_ENDPOINT_URL")
    public = urlsplit(internal)._replace(netloc=f"localhost:{urlsplit(internal).port}").geturl()
    bucket = service("JOBSAPP_TEST_S3_BUCKET")
    with (
        environment(JOBSAPP_S3_PUBLIC_URL=public),
        configured_store(f"s3://{bucket}/tests/{uuid.uuid4().hex}", internal) as store,
    ):
        yield store, public
    clear_store_cache()


def test_a_read_url_names_the_public_endpoint_and_serves_the_object(
    public_s3: tuple[ObjectStore, str],
) -> None:
    store, public = public_s3
    data = b"\x89PNG variant bytes"
    store.put_if_absent("v/thumb.png", data, hashlib.sha256(data).hexdigest(), "image/png")

    url = store.read_url("v/thumb.png", expires_s=60)

    assert url is not None
    assert url.startswith(public + "/")
    query = parse_qs(urlsplit(url).query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert "Signature" not in query  # no SigV2 parameters
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - our own server
        assert response.read() == data


def test_without_a_public_endpoint_read_urls_are_sigv4_on_the_internal_one(
    s3: ObjectStore,
) -> None:
    data = b"GIF89a bytes"
    s3.put_if_absent("v/crop.gif", data, hashlib.sha256(data).hexdigest(), "image/gif")

    url = s3.read_url("v/crop.gif", expires_s=60)

    assert url is not None
    assert url.startswith(service("JOBSAPP_TEST_S3_ENDPOINT_URL") + "/")
    assert parse_qs(urlsplit(url).query)["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - our own server
        assert response.read() == data
