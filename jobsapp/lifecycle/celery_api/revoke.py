"""``app.control.revoke`` made durable for lifecycle jobs: the app's ``Control`` class.

Celery keeps revokes in each worker's memory (a worker started later never hears of
one: celery#4300). Here the producer's call writes to the journal first, so a restart
does not forget: a queued job is cancelled at once (it never runs), a running attempt
gets a cancel request that its heartbeat turns into ``CancelRequested`` in the body
(journal/revoking.py). Then Celery's own revoke goes out as ever, with the running
attempt's task id added, so ``terminate=True`` still kills it where the pool can (the
reaper then ends the run cancelled). Hooked on the producer's side, not in the worker's
control handler: a broadcast no worker was up to receive is lost, the journal is not.

An id names a job the way ``AsyncResult`` reads it (``message.job_id_of_task``: the job
id, or the caller's own task id), or is one of its attempts' own task ids (the ones
Flower lists, whose revoke button sends them): an id that names no run is looked for among
the active runs' attempts (journal/task_ids.py), then goes to Celery's revoke as well.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from celery import Celery
from celery.app.control import Control
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import OperationalError

from jobsapp.db import get_engine
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import Revoked, registry, workflow
from jobsapp.lifecycle.journal.outbox_rows import PendingMessage
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules import message
from jobsapp.lifecycle.transport import outbox

log = logging.getLogger(__name__)

REASON = "revoked (app.control.revoke)"
T = TypeVar("T")


def revoke_jobs(
    task_ids: Iterable[str],
    *,
    actor: str = "revoke",
    started: list[PendingMessage] | None = None,
) -> list[str]:
    """Write each id's revoke in the journal; the task ids of the attempts now asked to
    stop (for Celery's own revoke). What a queued workflow step's cancel started joins
    ``started``, to publish once written (journal/cancel.py)."""
    running: list[str] = []
    engine = get_engine()
    for task_id in map(str, task_ids):
        job_id = message.job_id_of_task(task_id)
        found = _revoke(engine, job_id, actor, started)
        if found is None:
            found = _revoke_attempt(engine, task_id, actor, started)
        if found is None:
            found = _revoke_unstarted(engine, job_id, actor, started)
        if found:
            running.append(found)
    return running


def _in_tables(engine: Engine, write: Callable[[Connection, RunTable], T | None]) -> T | None:
    """``write`` in each run table, each in a transaction of its own, until one answers."""
    for spec in registry.all_tables():
        with engine.begin() as conn:
            done = write(conn, spec)
        if done is not None:
            return done
    return None


def _revoke(
    engine: Engine, job_id: uuid.UUID, actor: str, started: list[PendingMessage] | None
) -> str | None:
    """Revoke the job in whichever run table holds it; the task id of its attempt asked
    to stop, "" when it was not running, None when no table holds it."""
    return _in_tables(engine, lambda conn, spec: _revoke_in(conn, spec, job_id, actor, started))


def _revoke_attempt(
    engine: Engine, task_id: str, actor: str, started: list[PendingMessage] | None
) -> str | None:
    """Revoke the active job one of whose attempts is ``task_id`` (as ``_revoke``)."""
    if not _name_based(task_id):
        return None

    def write(conn: Connection, spec: RunTable) -> str | None:
        job_id = journal.job_of_attempt(conn, spec, task_id)
        return None if job_id is None else _revoke_in(conn, spec, job_id, actor, started)

    return _in_tables(engine, write)


def _revoke_unstarted(
    engine: Engine, job_id: uuid.UUID, actor: str, started: list[PendingMessage] | None
) -> str | None:
    """Revoke the workflow step ``job_id`` whose run is not written yet, so a worker that
    never heard Celery's broadcast does not run it either (as ``_revoke``; a step whose
    run was written meanwhile is revoked as a run). Without ``started``, what its block
    started (a chord body's errbacks) waits for the relay."""
    held: list[PendingMessage] = [] if started is None else started
    with engine.begin() as conn:
        done = workflow.revoke_unstarted(conn, job_id, REASON, actor=actor, started=held)
    if done is workflow.StepRevoke.HAS_RUN:
        return _revoke(engine, job_id, actor, started)
    if done is workflow.StepRevoke.NO_STEP:
        return None
    log.info("workflow step %s: revoke %s", job_id, done.value)
    return ""


def _name_based(task_id: str) -> bool:
    """An attempt's task id is a name-based UUID (version 5, ``message.task_id_for``);
    Celery's own are random (version 4): a plain task's revoke costs no look-up."""
    try:
        return uuid.UUID(task_id).version == 5
    except ValueError:
        return False


def _revoke_in(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    actor: str,
    started: list[PendingMessage] | None,
) -> str | None:
    done = journal.revoke(conn, spec, job_id, actor=actor, reason=REASON, started=started)
    if done is Revoked.UNKNOWN:
        return None
    log.info("%s job %s: revoke %s", spec.module, job_id, done.value)
    if done is not Revoked.REQUESTED:
        return ""
    row = journal.load(conn, spec, job_id)
    return "" if row is None else message.task_id_for(job_id, row.attempts)


# Why a run a worker's revoked list named ends cancelled (worker_discarded).
DISCARDED = "revoked (a worker's list of revoked task ids)"


def worker_discarded(app: Celery, task_id: str, request: Any) -> bool:
    """A worker discarded a lifecycle message whose id its memory lists as revoked: a
    revoke broadcast that did not come through ``app.control.revoke`` (``celery control
    revoke``), or one made before the job's enqueue committed (the journal had no run to
    cancel then). The run still waiting for that attempt is cancelled, so the journal agrees
    with the worker and the relay does not publish it again and again. The attempt is the
    message's (``retries`` + 1), its job the id itself for a first attempt and the message's
    ``root_id`` for a later one (outbox.py's links). What a workflow step's cancel started
    (a chord body's errbacks) is published once written. True when a run was cancelled."""
    attempt = int(getattr(request, "retries", None) or 0) + 1
    named = task_id if attempt == 1 else getattr(request, "root_id", None)
    try:
        job_id = uuid.UUID(str(named))
    except ValueError:
        return False
    if message.task_id_for(job_id, attempt) != task_id:
        return False  # not an attempt jobsapp published

    started: list[PendingMessage] = []

    def write(conn: Connection, spec: RunTable) -> bool | None:
        if not journal.cancel(
            conn,
            spec,
            job_id,
            attempts=attempt - 1,
            actor="revoke",
            reason=DISCARDED,
            started=started,
        ):
            return None
        log.info("%s job %s: cancelled, %s", spec.module, job_id, DISCARDED)
        return True

    try:
        done = bool(_in_tables(get_engine(), write))
        publish_started(app, started)
        return done
    except OperationalError as down:
        # Called in the worker's consumer: an outage must not reach it. The relay's next
        # publish of the run is discarded again, and its cancel tried again then.
        log.warning("job %s: revoke not recorded (%s)", job_id, type(down.orig).__name__)
    return False


def publish_started(app: Celery, started: list[PendingMessage]) -> None:
    """What a queued workflow step's cancel started, after its COMMIT: a plain job's
    revoke started nothing, and sends nothing. Their sender is the workflow, not a task
    that called the revoke."""
    outbox.publish_started(app, started, by_running_task=False)


def revoke_in_journal(
    app: Any,
    task_ids: Sequence[str],
    *,
    terminate: bool = False,
    signal: str = "SIGTERM",
    **kwargs: Any,
) -> Any:
    """The journal's revoke of ``task_ids``, then Celery's own in the workers' memory (and
    ``terminate`` where the pool can), naming each running attempt too; whatever control
    ``app`` has (a team's app keeps Celery's)."""
    ids = list(task_ids)
    started: list[PendingMessage] = []
    attempts = [found for found in revoke_jobs(ids, started=started) if found not in ids]
    publish_started(app, started)
    return Control.revoke(app.control, ids + attempts, terminate=terminate, signal=signal, **kwargs)


class JournalControl(Control):
    """Celery's ``Control`` whose ``revoke`` is kept in the journal first (module doc);
    ``Celery(..., control="jobsapp.lifecycle.celery_api.revoke:JournalControl")``."""

    def revoke(
        self,
        task_id: str | Sequence[str],
        destination: Any = None,
        terminate: bool = False,
        signal: str = "SIGTERM",
        **kwargs: Any,
    ) -> Any:
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        return revoke_in_journal(
            self.app, ids, destination=destination, terminate=terminate, signal=signal, **kwargs
        )

    def tell_workers(
        self,
        task_ids: Sequence[str],
        *,
        terminate: bool = False,
        signal: str = "SIGTERM",
        **kwargs: Any,
    ) -> Any:
        """Celery's own revoke only (each worker's memory; terminate where the pool can):
        for a caller that already wrote the journal (operator.py's cancel)."""
        return super().revoke(list(task_ids), terminate=terminate, signal=signal, **kwargs)
