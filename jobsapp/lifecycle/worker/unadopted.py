"""A plain call of a lifecycle task (``send_task`` by name) whose message a worker discards
before adopting it as a run: its ``expires`` passed in the broker. The journal had no run
for it, so its id read ``PENDING`` for good where Celery's answer is ``REVOKED``; its run
is written expired, as if the worker had adopted it and found it expired (jobsapp's own
messages need none of this: their runs are the journal's, which expires them itself). Its
first message is written with it, as every enqueue's; beat's relay publishes it once, the
claim refuses it (the run is over) and the relay settles it.

Celery's worker tells the task's backend and the ``task_revoked`` signal in its consumer;
celery_app.py hands the signal here (an outage must not reach the consumer: logged, left).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import OperationalError

from jobsapp.db import get_engine, utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.producer import newjob
from jobsapp.lifecycle.rules import message
from jobsapp.lifecycle.rules.errors import InvalidMessage

log = logging.getLogger(__name__)


def record_expired(task: Any, request: Any) -> bool:
    """Write the expired run of ``request``'s plain call of ``task``; True when one was
    written."""
    spec = getattr(task, "run_table", None)
    if not isinstance(spec, RunTable) or request is None or not request.expires:
        return False
    args, kwargs = tuple(request.args or ()), dict(request.kwargs or {})
    if message.is_envelope(args, kwargs):
        return False
    try:
        job = newjob.adopted(task, str(request.id), None, args, kwargs)[1]
    except InvalidMessage:
        return False  # a call no run of this task could take: Celery's answer stands
    now = utcnow()
    job = replace(job, expires_at=min(_instant(request.expires) or now, now))
    try:
        with get_engine().begin() as conn:
            enqueued = journal.enqueue(conn, job, actor="worker")
            if enqueued.outcome is not journal.EnqueueOutcome.ENQUEUED:
                return False  # adopted already (a copy of the message ran)
            return journal.expire(conn, spec, job.job_id, actor="worker", now=now)
    except OperationalError as down:
        log.warning("job %s: its expiry not recorded (%s)", job.job_id, type(down.orig).__name__)
    return False


def _instant(expires: Any) -> datetime | None:
    """Celery's ``expires`` header (ISO 8601; UTC when it names no offset)."""
    try:
        at = expires if isinstance(expires, datetime) else datetime.fromisoformat(str(expires))
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
