"""A task whose dedup window outlasts the default run retention (7 days).

Imported only by the processes that tests/e2e/test_retention_refusal.py starts (through
``JOBSAPP_IMPORTS``): in any other process it would make retention refuse to run.
"""

from __future__ import annotations

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task

WINDOW_DAYS = 30


@lifecycle_task(app, name="tests.long_window", dedup_window=WINDOW_DAYS * 86_400)
def long_window(token: str) -> None:
    del token
