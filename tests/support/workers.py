"""The in-process Celery worker the integration tests run tasks on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from celery.contrib.testing.worker import TestWorkController, start_worker
from celery.signals import worker_init

from jobsapp import preflight
from jobsapp.celery_app import app


@contextmanager
def in_process_worker(concurrency: int = 2) -> Iterator[TestWorkController]:
    """A threads-pool worker in this process, without the start-up checks of a real one.

    Those checks guard a worker process (tests/e2e/test_errors.py runs them); this worker
    runs tasks for tests that break storage or the broker on purpose meanwhile, and a check
    failing here would exit the test process.
    """
    app.loader.import_default_modules()
    worker_init.disconnect(preflight.worker_started)
    try:
        with start_worker(
            app, pool="threads", concurrency=concurrency, perform_ping_check=False
        ) as worker:
            yield worker
    finally:
        worker_init.connect(preflight.worker_started, weak=False)
