"""jobsapp's no-op job, a ``LifecycleTask`` (loaded through ``JOBSAPP_IMPORTS``)."""

from __future__ import annotations

from bench.tasks import count_done
from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task


@lifecycle_task(app, name="bench.lifecycle")
def with_lifecycle() -> None:
    count_done()
