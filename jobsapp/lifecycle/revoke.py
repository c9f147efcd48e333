"""``app.control.revoke`` made durable for lifecycle jobs: the app's ``Control`` class.

Celery keeps revokes in each worker's memory (a worker started later never hears of
one: celery#4300). Here the producer's call writes to the journal first, so a restart
does not forget: a queued job is cancelled at once (it never runs), a running attempt
gets a cancel request that its heartbeat turns into ``CancelRequested`` in the body
(journal/revoke.py). Then Celery's own revoke goes out as ever, with the running
attempt's task id added, so ``terminate=True`` still kills it where the pool can (the
reaper then ends the run cancelled). Hooked on the producer's side, not in the worker's
control handler: a broadcast no worker was up to receive is lost, the journal is not.

An id names a job the way ``AsyncResult`` reads it (``message.job_id_of_task``: the job
id, or the caller's own task id). An attempt's own task id (Flower's) names no row and
goes to Celery's revoke unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from celery.app.control import Control

from jobsapp.db import get_engine
from jobsapp.lifecycle import journal, message, registry
from jobsapp.lifecycle.journal import Revoked

log = logging.getLogger(__name__)

REASON = "revoked (app.control.revoke)"


def revoke_jobs(task_ids: Iterable[str], *, actor: str = "revoke") -> list[str]:
    """Write each id's revoke in the journal; the task ids of the attempts now asked to
    stop (for Celery's own revoke)."""
    running: list[str] = []
    engine = get_engine()
    for task_id in task_ids:
        job_id = message.job_id_of_task(str(task_id))
        for spec in registry.all_tables():
            with engine.begin() as conn:
                done = journal.revoke(conn, spec, job_id, actor=actor, reason=REASON)
                row = journal.load(conn, spec, job_id) if done is Revoked.REQUESTED else None
            if done is Revoked.UNKNOWN:
                continue
            log.info("%s job %s: revoke %s", spec.module, job_id, done.value)
            if row is not None:
                running.append(message.task_id_for(job_id, int(row["attempts"])))
            break
    return running


class JournalControl(Control):
    """Celery's ``Control`` whose ``revoke`` is kept in the journal first (module doc);
    ``Celery(..., control="jobsapp.lifecycle.revoke:JournalControl")``."""

    def revoke(
        self, task_id: str | Sequence[str], destination: Any = None, terminate: bool = False,
        signal: str = "SIGTERM", **kwargs: Any,
    ) -> Any:  # fmt: skip
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        attempts = revoke_jobs(ids)
        return super().revoke(ids + attempts, destination=destination, terminate=terminate,
                              signal=signal, **kwargs)  # fmt: skip
