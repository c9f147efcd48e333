"""Green pools are refused: their heartbeat greenlet starves under CPU-bound jobs."""

from __future__ import annotations

import pytest
from celery.concurrency import get_implementation

from jobsapp.lifecycle.worker.pools import green_pool_refusal


@pytest.mark.parametrize("pool", ["prefork", "solo", "threads"])
def test_pools_with_real_threads_or_processes_are_accepted(pool: str) -> None:
    assert green_pool_refusal(get_implementation(pool)) is None


def test_the_gevent_pool_is_refused_with_the_reason_and_the_way_out() -> None:
    reason = green_pool_refusal(get_implementation("gevent"))
    assert reason is not None
    assert "celery.concurrency.gevent.TaskPool" in reason
    assert "starves the heartbeat" in reason
    assert "--pool=prefork" in reason


def test_any_pool_celery_treats_as_green_is_refused() -> None:
    """eventlet's pool needs greenlet to import; Celery's own marker decides."""

    class Green:
        is_green = True

    assert green_pool_refusal(Green) is not None
