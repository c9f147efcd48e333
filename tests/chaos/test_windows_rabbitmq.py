"""The failure windows again on RabbitMQ (``pyamqp://``, publisher confirms on).

Here "confirm" is a real publisher confirm: ``after_publish_before_confirm`` dies after the
broker confirmed the message and before the outbox row is marked. And a lost consumer's
unacknowledged message is requeued by the broker as soon as its connection drops: no
visibility timeout is involved.

The windows whose outcome the journal alone decides (a publish the relay makes again, an S3
write before the commit, an ack lost after the commit, a zombie's fenced writes) run on Redis
in CI (test_windows.py) and here in the soak run (``-m soak``): on RabbitMQ, CI keeps the
windows where the broker's own behaviour differs (a confirm, a requeue on a dropped
connection, a child killed mid-run).
"""

from __future__ import annotations

import pytest

from tests.chaos import windows
from tests.chaos.harness import Cluster

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(120)]


@pytest.mark.soak
def test_web_dies_after_commit_before_publish(amqp_cluster: Cluster) -> None:
    windows.after_commit_before_publish(amqp_cluster)


def test_web_dies_after_publish_before_confirm(amqp_cluster: Cluster) -> None:
    windows.after_publish_before_confirm(amqp_cluster)


@pytest.mark.soak
def test_worker_dies_after_s3_write_before_commit(amqp_cluster: Cluster) -> None:
    windows.after_s3_write_before_commit(amqp_cluster)


@pytest.mark.soak
def test_worker_dies_after_result_commit_before_ack(amqp_cluster: Cluster) -> None:
    windows.after_result_commit_before_ack(amqp_cluster)


def test_whole_worker_lost_after_result_commit_is_requeued_by_the_broker(
    amqp_cluster: Cluster,
) -> None:
    windows.whole_worker_lost_after_result_commit(amqp_cluster, None)


def test_worker_dies_mid_run(amqp_cluster: Cluster) -> None:
    windows.worker_dies_mid_run(amqp_cluster)


@pytest.mark.soak
def test_zombie_worker_wakes_after_its_lease_was_taken(amqp_cluster: Cluster) -> None:
    windows.zombie_wakes_after_lease_taken(amqp_cluster)
