"""Fixtures the integration modules share."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from jobsapp.storage import ObjectStore
from tests.support.attachments import configured_store
from tests.support.env import service


@pytest.fixture
def s3() -> Iterator[ObjectStore]:
    """The attachment store on SeaweedFS, under a prefix of this test's own."""
    bucket = service("JOBSAPP_TEST_S3_BUCKET")
    endpoint = service("JOBSAPP_TEST_S3_ENDPOINT_URL")
    with configured_store(f"s3://{bucket}/tests/{uuid.uuid4().hex}", endpoint) as store:
        yield store
