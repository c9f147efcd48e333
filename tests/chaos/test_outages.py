"""A service restarted under load: Redis (broker and dedup), then PostgreSQL.

Uploads keep arriving through the real web process while the service is killed and
started again; the workers and beat are never restarted by the test. Every upload the
web accepted (202) must end ``ready``, published once; while the database is down the
web answers 503 (with Retry-After) and accepts again once it is back. Both services are
private to the test (a ``redis-server`` and a PostgreSQL cluster of its own), so the
restart harms no other test session on the machine.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.harness import (
    Burst,
    Cluster,
    PrivatePostgres,
    Reply,
    private_pg_cluster,
    private_postgres,
    start_all,
    status_of,
)
from tests.support.servers import RedisServer

pytestmark = pytest.mark.timeout(180)


def _all_published(cluster: Cluster, accepted: list[uuid.UUID]) -> None:
    """Every accepted upload, and every row at all, ready and published exactly once."""
    for attachment_id in accepted:
        cluster.settled(attachment_id, timeout=60)
    rows = cluster.attachments()
    assert set(accepted) <= {r["id"] for r in rows}
    for row in rows:
        cluster.settled(row["id"], timeout=30)
    # An outage may cancel a task between its result COMMIT and its staging delete (the
    # worker cancels running tasks when it loses the broker); retention's ready rule is
    # the documented cleanup of that window.
    cluster.maintenance("staging")
    for row in rows:
        cluster.assert_published_once(row["id"])
    # Every message was published, and the relay saw each one claimed.
    cluster.wait_for(
        lambda: all(m["published_at"] and m["delivered_at"] for m in cluster.all_outbox()),
        "outbox drained",
        30,
    )


def test_redis_restarted_during_a_burst(cluster: Cluster, redis_server: RedisServer) -> None:
    procs = start_all(cluster, "w1", "w2")
    web = cluster.web()

    with Burst(cluster, web, count=30, pause=0.1) as burst:
        burst.wait_for(lambda replies: len(replies) >= 8, "8 uploads answered")
        # SIGKILL: the queue, the unacked messages and the dedup keys are lost with it.
        redis_server.restart(down_for=2.0)
        burst.join()

    # Accepting needs the database and the store only: nothing was refused.
    assert burst.statuses() == {202: 30}
    _all_published(cluster, burst.accepted())
    assert all(p.alive() for p in procs), "a worker or beat did not survive the restart"


@pytest.fixture
def private_pg(tmp_path: Path) -> Iterator[PrivatePostgres]:
    with private_postgres() as server:
        yield server


@pytest.fixture
def pg_cluster(
    private_pg: PrivatePostgres, redis_server: RedisServer, tmp_path: Path
) -> Iterator[Cluster]:
    with private_pg_cluster(private_pg, redis_server, tmp_path) as cluster:
        yield cluster


def test_postgres_restarted_during_a_burst(
    pg_cluster: Cluster, private_pg: PrivatePostgres
) -> None:
    cluster = pg_cluster
    procs = start_all(cluster, "w1", "w2")
    web = cluster.web()

    with Burst(cluster, web, pause=0.1) as burst:
        burst.wait_for(lambda replies: len(replies) >= 8, "8 uploads answered")
        private_pg.stop()
        down = time.monotonic()
        burst.wait_for(lambda _: 503 in map(status_of, burst.answers_since(down)), "a 503", 15)
        # Down for longer than the stale limit: running heartbeats go stale meanwhile.
        time.sleep(3.0)
        private_pg.start()
        up = time.monotonic()
        burst.wait_for(lambda _: 202 in map(status_of, burst.answers_since(up)), "a 202", 30)
        again = time.monotonic()
        burst.wait_for(lambda _: len(burst.answers_since(again)) >= 5, "5 more uploads")

    statuses = burst.statuses()
    assert set(statuses) <= {202, 503}, statuses
    for _, reply in burst.replies:
        if isinstance(reply, Reply) and reply.status == 503:
            assert reply.json()["error"] == "unavailable"
            assert int(reply.headers["Retry-After"]) > 0
    # Accepting resumed: everything after the first 202 past the restart is a 202.
    after = [status_of(r) for r in burst.answers_since(again)]
    assert after == [202] * len(after), after
    print(f"burst through a Postgres restart: {dict(statuses)}")
    _all_published(cluster, burst.accepted())
    assert all(p.alive() for p in procs), "a worker or beat did not survive the restart"
