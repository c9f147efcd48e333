"""A plain Celery app, as a Celery user writes it, beside jobsapp in the priority tests.

Its worker is ``celery -A tests.support.bare_celery worker``, with the broker and the
queue in ``BARE_BROKER_URL`` and ``BARE_QUEUE``. Nothing of jobsapp is imported here, so
that worker is plain Celery. Its task records the order of its runs in the test Redis.
"""

from __future__ import annotations

import os

import redis
from celery import Celery

BROKER_URL, QUEUE = "BARE_BROKER_URL", "BARE_QUEUE"


def order_key(token: str) -> str:
    return f"jobsapp-test:bare-celery:{token}:order"


def make_app(broker_url: str, queue: str) -> Celery:
    """Celery's documented priority set-up: x-max-priority on RabbitMQ; on Redis every
    level its own list (kombu's default groups them by four) polled by priority."""
    app = Celery("bare", broker=broker_url)
    app.conf.task_default_queue = queue
    app.conf.task_queue_max_priority = 9
    app.conf.worker_prefetch_multiplier = 1
    app.conf.broker_transport_options = {
        "priority_steps": list(range(10)),
        "sep": ":",
        "queue_order_strategy": "priority",
    }

    @app.task(name="tests.bare.ordered")
    def ordered(token: str, label: str) -> None:
        redis.Redis.from_url(os.environ["JOBSAPP_TEST_REDIS_URL"]).rpush(order_key(token), label)

    return app


app = make_app(os.environ.get(BROKER_URL, "memory://"), os.environ.get(QUEUE, "celery"))
