"""The idioms' bodies on a bare Celery app, as a Celery team declares them:
``celery -A tests.conformance.bare_app worker``. Broker ``CONFORMANCE_BROKER_URL`` (Redis
or RabbitMQ), Celery's Redis result backend, the queue ``CONFORMANCE_QUEUE``."""

from __future__ import annotations

import os

from celery import Celery

from tests.conformance.bodies import BODIES, OPTIONS, REDIS_URL

app = Celery(
    "bare-conformance",
    broker=os.environ.get("CONFORMANCE_BROKER_URL", "memory://"),
    backend=os.environ.get(REDIS_URL),
)
app.conf.task_default_queue = os.environ.get("CONFORMANCE_QUEUE", "celery")
# A result's name, arguments, retries and queue, which the journal keeps for every run.
app.conf.result_extended = True
app.conf.result_extended = True

TASKS = {
    name: app.task(name=f"bare.{name}", **OPTIONS.get(name, {}))(body)
    for name, body in BODIES.items()
}
