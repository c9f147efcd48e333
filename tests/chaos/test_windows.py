"""The failure windows on Redis, one test each: crash there, recover, check rows and bucket.

See tests/chaos/windows.py for the scenarios and docs/reliability.md for what each proves.
"""

from __future__ import annotations

import pytest

from tests.chaos import windows
from tests.chaos.harness import Cluster
from tests.support.servers import RedisServer

pytestmark = pytest.mark.timeout(120)


def test_web_dies_after_staging_before_the_row(cluster: Cluster) -> None:
    windows.after_staging(cluster)


def test_web_dies_after_commit_before_publish(cluster: Cluster) -> None:
    windows.after_commit_before_publish(cluster)


def test_web_dies_after_publish_before_confirm(cluster: Cluster) -> None:
    windows.after_publish_before_confirm(cluster)


def test_worker_dies_after_s3_write_before_commit(cluster: Cluster) -> None:
    windows.after_s3_write_before_commit(cluster)


def test_worker_dies_after_result_commit_before_ack(cluster: Cluster) -> None:
    windows.after_result_commit_before_ack(cluster)


def test_whole_worker_lost_after_result_commit_is_redelivered_after_visibility_timeout(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    windows.whole_worker_lost_after_result_commit(cluster, redis_server)


def test_worker_dies_mid_run(cluster: Cluster) -> None:
    windows.worker_dies_mid_run(cluster)


def test_zombie_worker_wakes_after_its_lease_was_taken(cluster: Cluster) -> None:
    windows.zombie_wakes_after_lease_taken(cluster)
