"""The scale benchmark's job (jobsapp's no-op) and broker queue, loaded by every process
through ``JOBSAPP_IMPORTS``: with ``BENCH_QUORUM=1`` Celery's queue is a RabbitMQ quorum
queue, declared alike by producer, workers and beats (a queue redeclared with other
arguments is refused by the broker)."""

from __future__ import annotations

import os

from kombu import Exchange, Queue

from bench.lifecycle_tasks import with_lifecycle
from jobsapp.celery_app import app

__all__ = ["with_lifecycle"]

if os.environ.get("BENCH_QUORUM") == "1":
    app.conf.task_queues = (
        Queue(
            "celery",
            Exchange("celery", type="direct"),
            routing_key="celery",
            queue_arguments={"x-queue-type": "quorum"},
        ),
    )
