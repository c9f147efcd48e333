"""Fixtures the integration modules share."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobsapp.storage import ObjectStore
from tests.support.attachments import configured_store
from tests.support.env import service
from tests.support.procs import Launcher, service_env


@pytest.fixture
def launcher(postgres_url: str, tmp_path: Path) -> Iterator[Launcher]:
    """Subprocesses (producers, workers) on this session's Postgres journal and broker."""
    env = service_env(
        database_url=postgres_url,
        broker_url=os.environ["JOBSAPP_BROKER_URL"],
        var_dir=tmp_path,
        settings={},
    )
    started = Launcher(env, tmp_path)
    yield started
    started.kill_all()


@pytest.fixture
def s3() -> Iterator[ObjectStore]:
    """The attachment store on SeaweedFS, under a prefix of this test's own."""
    bucket = service("JOBSAPP_TEST_S3_BUCKET")
    endpoint = service("JOBSAPP_TEST_S3_ENDPOINT_URL")
    with configured_store(f"s3://{bucket}/tests/{uuid.uuid4().hex}", endpoint) as store:
        yield store
