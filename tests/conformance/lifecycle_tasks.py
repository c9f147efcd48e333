"""The idioms' bodies as lifecycle tasks, with their bare twins' Celery options
(bare_app.py) plus the journal's own retry spacing: ``JOBSAPP_IMPORTS`` names this module
for the worker and beat, and the program's process imports it. The queue is the test's
(``CONFORMANCE_QUEUE``): every process that imports this module sends there."""

from __future__ import annotations

import os

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from jobsapp.lifecycle.rules.retry import RetryPolicy
from tests.conformance.bodies import BODIES, OPTIONS

FAST = RetryPolicy(base_delay=0.2, max_delay=0.5, jitter=0.0)

if "CONFORMANCE_QUEUE" in os.environ:
    app.conf.task_default_queue = os.environ["CONFORMANCE_QUEUE"]

TASKS = {
    name: lifecycle_task(app, name=f"conf.{name}", retry_policy=FAST, **OPTIONS.get(name, {}))(body)
    for name, body in BODIES.items()
}
