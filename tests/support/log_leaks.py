"""Tasks whose failures put credentials in the worker's log, through Celery and ``logging``.

Plain Celery tasks (not lifecycle ones), so that nothing of jobsapp's own error handling
stands between the exception and Celery's "Task ... raised unexpected" line.
"""

from __future__ import annotations

import logging

from jobsapp.celery_app import app
from tests.support.tasks import planted_secrets

log = logging.getLogger(__name__)


def _leaky_error(token: str) -> ConnectionError:
    s = planted_secrets(token)
    return ConnectionError(
        f"AWS_SECRET_ACCESS_KEY={s['aws']} refused by https://svc:{s['url']}@api.example.com; "
        f"Authorization: Bearer {s['bearer']}"
    )


@app.task(name="tests.raises_secrets")
def raises_secrets(token: str) -> None:
    """Fails out of Celery's tracer, the cause holding a database URL."""
    cause = OSError(f"connect to postgresql://app:{planted_secrets(token)['db']}@db:5432/jobs")
    raise _leaky_error(token) from cause


@app.task(name="tests.logs_secrets")
def logs_secrets(token: str) -> None:
    """Handles its error itself, with ``log.exception`` and the secret in the arguments."""
    try:
        raise _leaky_error(token)
    except ConnectionError:
        log.exception("upstream failed; retried with token=%s", planted_secrets(token)["token"])
