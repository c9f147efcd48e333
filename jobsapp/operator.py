"""Operator actions on one run: replay a failed job, cancel a queued or running one.

Each action is one transaction: the journal's guarded transition with its audit row in
``job_events`` (actor ``operator:<name>``, the operator's reason), the run table's own
mirror of the move (``RunTable.on_change``: the attachments domain moves its
client-visible row there), and any operator hook registered here for the module. A
replay's message is published only after that COMMIT; if the fast path fails, the relay
publishes the outbox row.

A refusal is an exception that says why in words an operator can act on: ``NotFound``
(no such module or job) or ``Conflict`` (the job is in the wrong state, or another run
holds its concurrency key).
"""

from __future__ import annotations

import logging
import unicodedata
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache

from celery import Celery
from kombu.exceptions import OperationalError
from sqlalchemy import Connection, Engine

from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.celery_api.revoke import JournalControl, publish_started
from jobsapp.lifecycle.journal import KeyBusy, Reopened, Revoked, Run, registry
from jobsapp.lifecycle.journal.outbox_rows import PendingMessage
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules.message import task_id_for
from jobsapp.lifecycle.rules.states import State, Transition
from jobsapp.lifecycle.transport import outbox

log = logging.getLogger(__name__)

ACTOR_PREFIX = "operator:"
MAX_ERROR_CODE = 64  # the domains keep their codes in String(64) columns
MAX_REASON = 500
MAX_ACTOR = 100

# Runs inside the action's transaction after the run row moved: (conn, run row, now).
# Raising refuses the whole action; the run row stays as it was.
# A domain's hook gets the moved run (its own columns in ``Run.columns``) and the
# database's time of the move.
Hook = Callable[[Connection, Run, datetime], None]


class InvalidRequest(ValueError):
    """The operator's input is unusable (an empty reason, an actor name with newlines)."""


class Refused(Exception):
    """The action was not taken; ``code`` is stable, the message is for the operator."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        state: str | None = None,
        holder: uuid.UUID | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.state = state
        self.holder = holder


# The attempts a replay grants unless its caller says otherwise.
REPLAY_BUDGET = 1


class NotFound(Refused):
    """No run table for the module, or no such job in it."""


class Conflict(Refused):
    """The job is not in the state the action leaves, or its key is held."""


@dataclass(frozen=True)
class ReplayResult:
    module: str
    job_id: uuid.UUID
    attempt: int
    # False: the broker did not take the message now; the relay publishes it later.
    published: bool
    # True: its limited key's slots are all held; it runs when one frees (not published).
    waiting: bool = False

    @property
    def then(self) -> str:
        """What happens to its message next, for an operator."""
        if self.waiting:
            return "it waits for a free slot of its key"
        return "published" if self.published else "the relay will publish it"


@dataclass(frozen=True)
class CancelResult:
    module: str
    job_id: uuid.UUID
    attempts: int
    # False: it was queued and is failed/cancelled now. True: it is running, and its
    # attempt is told to stop at its next heartbeat (it then ends failed/cancelled).
    running: bool = False
    # Celery's terminate went to the running attempt's task id (the fallback for a body
    # that never returns to Python); False when not asked or the broker was not reached.
    terminate_sent: bool = False


# ------------------------------------------------------------------------ domain hooks

# A domain's own rows that mirror a run (an attachment's client-visible state) follow
# every transition through ``RunTable.on_change``, which the journal calls; these hooks
# are for what only an operator's action should do (a notification, a domain audit row).
_REPLAY_HOOKS: dict[str, Hook] = {}
_CANCEL_HOOKS: dict[str, Hook] = {}


def register_replay_hook(module: str, hook: Hook | None) -> Hook | None:
    """Make ``hook`` part of every replay of ``module``'s jobs (None: no hook any more);
    returns the one it replaced."""
    previous = _REPLAY_HOOKS.pop(module, None)
    if hook is not None:
        _REPLAY_HOOKS[module] = hook
    return previous


def register_cancel_hook(module: str, hook: Hook | None) -> Hook | None:
    """Make ``hook`` part of every cancel of a queued job of ``module`` (None: no hook
    any more); returns the one it replaced. A running job's cancel ends in its worker
    (journal ``honour_cancel``), where the domain's ``on_change`` follows it."""
    previous = _CANCEL_HOOKS.pop(module, None)
    if hook is not None:
        _CANCEL_HOOKS[module] = hook
    return previous


# ----------------------------------------------------------------------------- input


def operator_actor(name: str) -> str:
    """``operator:<name>``, the actor of the audit row; ``name`` is a login, not prose."""
    name = name.removeprefix(ACTOR_PREFIX).strip()
    if not 0 < len(name) <= MAX_ACTOR or not name.isprintable():
        raise InvalidRequest(f"the operator name must be 1 to {MAX_ACTOR} printable characters")
    return ACTOR_PREFIX + name


def checked_reason(reason: str) -> str:
    reason = reason.strip()
    if not 0 < len(reason) <= MAX_REASON:
        raise InvalidRequest(f"a reason of 1 to {MAX_REASON} characters is required")
    # The audit trail's reasons are read in terminals (``jobsapp queue list``, logs) and
    # pages: a line break, an escape sequence or a right-to-left override would rewrite
    # what they show; PostgreSQL's text cannot hold a NUL at all.
    hidden = next((ch for ch in reason if unicodedata.category(ch).startswith("C")), None)
    if hidden is not None:
        raise InvalidRequest(f"a reason is one line of visible text; it holds U+{ord(hidden):04X}")
    return reason


def checked_error_code(code: str | None) -> str | None:
    """An error code an operator names (reconcile by hand): None for every code."""
    if code is None:
        return None
    if "\x00" in code:  # PostgreSQL's text cannot hold it: a 500 at the query
        raise InvalidRequest("an error code cannot hold a NUL character")
    if len(code) > MAX_ERROR_CODE:
        raise InvalidRequest(f"an error code is at most {MAX_ERROR_CODE} characters")
    return code


def run_table(module: str) -> RunTable:
    try:
        return registry.get(module)
    except KeyError:
        known = ", ".join(sorted(t.module for t in registry.all_tables()))
        said = f"no run table is registered for {module!r} (known: {known})"
        raise NotFound("unknown_module", said) from None


def module_of(engine: Engine, job_id: uuid.UUID) -> str:
    """The run table that holds ``job_id`` (job ids are UUIDs: at most one does)."""
    tables = list(registry.all_tables())
    with engine.connect() as conn:
        for spec in tables:
            if journal.load(conn, spec, job_id) is not None:
                return spec.module
    known = ", ".join(sorted(t.module for t in tables))
    raise NotFound("unknown_job", f"no job {job_id} in any run table ({known})")


# ---------------------------------------------------------------------------- replay


def replay(
    engine: Engine,
    module: str,
    job_id: uuid.UUID,
    *,
    actor: str,
    reason: str,
    app: Celery | None = None,
    budget: int | None = None,
) -> ReplayResult:
    """failed -> queued as a new attempt of the same job, then publish its message.

    ``budget``: attempts the replay may use; by default **one** (Oban's and River's retry
    of a discarded job grant one too): the button, the API and the CLI all say "a new
    attempt", and the answer comes from the journal alone, the same from a process that
    imported the task modules or not. Replay again for another.
    """
    spec, who, why = run_table(module), operator_actor(actor), checked_reason(reason)
    app = app or _default_app()
    # Before the transaction: importing task modules must not hold SQLite's write lock.
    _import_tasks(app)
    with engine.begin() as conn:
        reopened = _reopen(conn, spec, job_id, who, why, lambda _run: budget or REPLAY_BUDGET)
    if reopened.message is None:
        return ReplayResult(spec.module, job_id, reopened.attempt, False, waiting=True)
    message = journal.on_local_clock(reopened.message, timedelta(0))
    published = outbox.publish_now(app, [message]) == 1
    return ReplayResult(spec.module, job_id, reopened.attempt, published)


def _reopen(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    who: str,
    why: str,
    budget: Callable[[journal.Run], int],
) -> Reopened:
    run = _current(conn, spec, job_id)
    if run.state != State.FAILED.value:
        raise Conflict("not_failed", _not_failed(spec, job_id, run.state), state=run.state)
    try:
        reopened = journal.reopen(
            conn,
            spec,
            job_id,
            from_state=State.FAILED,
            attempts=run.attempts,
            budget=budget(run),
            transition=Transition.REPLAY,
            actor=who,
            reason=why,
        )
    except KeyBusy as busy:
        raise Conflict("key_busy", _key_busy(run, busy.holder), holder=busy.holder) from None
    if reopened is None:
        raise Conflict("moved", f"{spec.module} job {job_id} changed meanwhile; look again")
    _run_hook(_REPLAY_HOOKS.get(spec.module), conn, spec, job_id)
    return reopened


_RUNNING_HINT = " (a running job finishes, or the reaper frees it)"
_HINTS = {
    State.SUCCEEDED.value: " (a succeeded job runs again when it is enqueued again)",
    State.QUEUED.value: " (it is already waiting for a worker)",
    State.RUNNING.value: _RUNNING_HINT,
}


def _not_failed(spec: RunTable, job_id: uuid.UUID, state: str) -> str:
    return (
        f"only a failed job can be replayed; {spec.module} job {job_id} is {state}"
        f"{_HINTS.get(state, '')}"
    )


def _key_busy(run: journal.Run, holder: uuid.UUID | None) -> str:
    return (
        f"concurrency key {run.concurrency_key!r} is held by active job {holder}; "
        "replay once that job has finished"
    )


# ---------------------------------------------------------------------------- cancel


def cancel(
    engine: Engine,
    module: str,
    job_id: uuid.UUID,
    *,
    actor: str,
    reason: str,
    attempts: int | None = None,
    terminate: bool = False,
    app: Celery | None = None,
) -> CancelResult:
    """queued -> failed/cancelled at once; a running job is asked to stop, through the
    journal path of ``app.control.revoke`` (journal/revoking.py): its attempt is told at its
    next heartbeat and ends failed/cancelled, its success refused.

    ``attempts``: the attempts the operator saw; a job that ran another attempt since is
    not cancelled blind (default: the row as read in this transaction). ``terminate``:
    also send Celery's terminate to the running attempt, the fallback for a body that
    never comes back to Python; asked again of a job already told to stop, it is audited
    and sent again. A queued workflow step's cancel publishes what it started (a chord
    body's errbacks: journal/cancel.py) once committed.
    """
    spec, who, why = run_table(module), operator_actor(actor), checked_reason(reason)
    started: list[PendingMessage] = []
    with engine.begin() as conn:
        run = _current(conn, spec, job_id)
        seen = run.attempts if attempts is None else attempts
        done = _revoke(conn, spec, job_id, seen, who, why, terminate=terminate, started=started)
        if done is Revoked.CANCELLED:
            hooked = _run_hook(_CANCEL_HOOKS.get(spec.module), conn, spec, job_id)
    if done is Revoked.CANCELLED:
        if started:
            publish_started(app or _default_app(), started)
        return CancelResult(spec.module, job_id, hooked)
    sent = terminate and _terminate(app or _default_app(), job_id, seen)
    return CancelResult(spec.module, job_id, seen, running=True, terminate_sent=sent)


def cancel_workflow(
    engine: Engine, module: str, job_id: uuid.UUID, *, actor: str, reason: str
) -> int:
    """The rest of the workflow the job is a step of: no step starts from now on, its
    queued steps end cancelled (docs/workflows.md); returns how many were cancelled."""
    spec, who, why = run_table(module), operator_actor(actor), checked_reason(reason)
    with engine.begin() as conn:
        workflow_id = _current(conn, spec, job_id).workflow_id
        if workflow_id is None:
            raise Conflict("not_a_step", f"{spec.module} job {job_id} is no workflow's step")
        return journal.cancel_rest(conn, workflow_id, actor=who, reason=why)


def _revoke(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    seen: int,
    who: str,
    why: str,
    *,
    terminate: bool,
    started: list[PendingMessage],
) -> Revoked:
    """The journal's revoke; a refusal (Conflict) unless the run is cancelled now or its
    attempt is asked to stop (now, or again with terminate, audited)."""
    why = f"{why} [terminate]" if terminate else why
    done = journal.revoke(conn, spec, job_id, actor=who, reason=why, seen=seen, started=started)
    if done in (Revoked.CANCELLED, Revoked.REQUESTED):
        return done
    run = _current(conn, spec, job_id)
    if done is Revoked.MOVED or run.attempts != seen:
        raise Conflict(
            "moved",
            f"{spec.module} job {job_id} is at attempt {run.attempts}, not {seen}; look again",
            state=run.state,
        )
    if run.state != State.RUNNING.value:
        raise Conflict("not_active", _not_active(spec, job_id, run.state), state=run.state)
    if not terminate:
        raise Conflict("cancel_pending", _pending(spec, job_id, run), state=run.state)
    if not journal.repeat_request(conn, spec, job_id, seen, actor=who, reason=why):
        raise Conflict("moved", f"{spec.module} job {job_id} changed meanwhile; look again")
    return Revoked.REQUESTED


def _not_active(spec: RunTable, job_id: uuid.UUID, state: str) -> str:
    return f"only a queued or running job can be cancelled; {spec.module} job {job_id} is {state}"


def _pending(spec: RunTable, job_id: uuid.UUID, run: journal.Run) -> str:
    asked = run.cancel_requested_at
    return (
        f"{spec.module} job {job_id} was asked to stop at {asked} and is still running; "
        "cancel again with terminate to kill its worker process"
    )


def _terminate(app: Celery, job_id: uuid.UUID, attempt: int) -> bool:
    """Celery's terminate of the attempt (its pool kills the process; the reaper then ends
    the run cancelled); False when the broker cannot take the broadcast now."""
    # A run a plain Celery message started (send_task) ran attempt 1 under the job's id.
    ids = [task_id_for(job_id, attempt), str(job_id)]
    control = app.control
    try:
        if isinstance(control, JournalControl):
            control.tell_workers(ids, terminate=True)
        else:
            control.revoke(ids, terminate=True)
    except (OSError, OperationalError) as down:
        log.warning("terminate of job %s not sent: %s", job_id, type(down).__name__)
        return False
    return True


# --------------------------------------------------------------------------- run now


@dataclass(frozen=True)
class RunNowResult:
    module: str
    job_id: uuid.UUID
    # False: the broker did not take the message now; the relay publishes it soon.
    published: bool


def run_now(
    engine: Engine,
    module: str,
    job_id: uuid.UUID,
    *,
    actor: str,
    reason: str,
    attempts: int | None = None,
    app: Celery | None = None,
) -> RunNowResult:
    """A queued job waiting for a retry's backoff or a countdown: due now, published now.

    ``attempts``: the attempts the operator saw (default: the row as read now)."""
    spec, who, why = run_table(module), operator_actor(actor), checked_reason(reason)
    with engine.begin() as conn:
        run = _current(conn, spec, job_id)
        seen = run.attempts if attempts is None else attempts
        messages = journal.bring_forward(
            conn, spec, job_id, attempts=seen, actor=who, reason=why, now=utcnow()
        )
        if messages is None:
            raise Conflict("not_scheduled", _not_scheduled(spec, job_id, run), state=run.state)
    published = outbox.publish_now(app or _default_app(), messages) == len(messages) > 0
    return RunNowResult(spec.module, job_id, published)


def _not_scheduled(spec: RunTable, job_id: uuid.UUID, run: journal.Run) -> str:
    if run.state != State.QUEUED.value:
        return f"only a queued job can run now; {spec.module} job {job_id} is {run.state}"
    return f"{spec.module} job {job_id} is already due (or moved meanwhile); look again"


# ---------------------------------------------------------------------------- shared


def _current(conn: Connection, spec: RunTable, job_id: uuid.UUID) -> journal.Run:
    run = journal.load(conn, spec, job_id)
    if run is None:
        raise NotFound("unknown_job", f"no {spec.module} job {job_id}")
    return run


def _run_hook(hook: Hook | None, conn: Connection, spec: RunTable, job_id: uuid.UUID) -> int:
    """The module's operator hook on the moved row (at its own, the database's, time);
    returns the row's attempts."""
    run = _current(conn, spec, job_id)
    if hook is not None:
        hook(conn, run, run.updated_at)
    return run.attempts


def _default_app() -> Celery:
    from jobsapp.celery_app import app

    return app


@cache
def _import_tasks(app: Celery) -> None:
    # The web and CLI processes know the tasks only once the worker's imports are loaded.
    app.loader.import_default_modules()


# ------------------------------------------------------------ dead outbox rows


def retry_dead_outbox(
    engine: Engine,
    ids: Sequence[int] | None,
    *,
    actor: str,
    reason: str,
    app: Celery | None = None,
) -> int:
    """Dead outbox rows (the named ones, or all) back to the relay, then published once.

    A row dies when its message kept failing on its own (a body that no longer validates,
    a task no worker takes); retry it after the cause is fixed (a deploy). Each revived row
    leaves an audit row; returns how many rows were revived.
    """
    who, why = operator_actor(actor), checked_reason(reason)
    with engine.begin() as conn:
        revived = journal.revive(conn, ids, actor=who, reason=why, now=utcnow())
    outbox.publish_now(app or _default_app(), revived)
    return len(revived)
