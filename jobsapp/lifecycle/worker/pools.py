"""Which Celery pools can run jobsapp's jobs: green ones cannot keep a lease alive.

A run's lease is its heartbeat thread (``lifecycle.heartbeat``). Under gevent or eventlet
that thread is a greenlet: a job that computes (Pillow resizing an image) never yields, so
no beat is written, the reaper takes the live run as stale and a second attempt starts
beside the first. Celery marks such pools ``is_green``; the worker refuses them at start.
"""

from __future__ import annotations

from typing import Any


def green_pool_refusal(pool_cls: Any) -> str | None:
    """The reason a worker with this pool class must not start, or None."""
    if not getattr(pool_cls, "is_green", False):
        return None
    name = f"{pool_cls.__module__}.{pool_cls.__qualname__}"
    return (
        f"jobsapp does not run on a green pool ({name}): a CPU-bound job starves the "
        "heartbeat greenlet and the reaper would take its live run; start the worker with "
        "--pool=prefork (the default), --pool=threads or --pool=solo"
    )
