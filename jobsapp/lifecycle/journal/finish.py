"""The worker's end of an attempt, fenced by the attempt and its claim's token.

Transition.SUCCEED (``succeed``), Transition.FAIL (``fail``), and Transition.RETRY and
Transition.SNOOZE (``requeue``: running -> queued, with the next attempt's message).
Called by lifecycle/worker/attempt.py; ``succeed`` also by lifecycle/worker/context.py
(``RunContext.completing``), ``fail`` also by attachments/tasks.py. The end of a workflow
step (a run with a ``workflow_id``) also starts, in the same transaction, what waited for
it (workflow.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from jobsapp.lifecycle.journal import hot, workflow
from jobsapp.lifecycle.journal.clock import _later, _stamp
from jobsapp.lifecycle.journal.events import Event
from jobsapp.lifecycle.journal.outbox_rows import PendingMessage, outgoing
from jobsapp.lifecycle.journal.plans import _run
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.run import Run
from jobsapp.lifecycle.rules.results import replaced_by
from jobsapp.lifecycle.rules.states import Outcome, State, Transition


def _finish(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    attempt: int,
    *,
    token: uuid.UUID,
    transition: Transition,
    outcome: Outcome,
    error: str | None,
    actor: str,
    now: datetime | None,
    detail: Mapping[str, Any] | None = None,
    result: Any = None,
) -> tuple[bool, uuid.UUID | None]:
    """Whether the attempt ended (False: the fence refused, the lease was lost), and the
    workflow its run is a step of. Read off the returned row without a typed row of its
    own: a success is on every job's path, and building one costs two calls."""
    now = _stamp(conn, now)
    state = State.SUCCEEDED if outcome is Outcome.SUCCEEDED else State.FAILED
    params = {
        "r_job_id": job_id,
        "r_attempts": attempt,
        "r_claim_token": token,
        "r_state": str(state),  # a StrEnum's value (events.py: no ``.value`` calls)
        "r_outcome": str(outcome),
        "r_last_error": error,
        "r_result": result,
        "r_now": now,
    }
    event = Event(spec, attempt, transition, State.RUNNING, state, actor, now, error, detail)
    plan = hot.finish(spec, conn.dialect.name, outcome is Outcome.SUCCEEDED)
    row = _run(conn, plan, params, event, None)[0]
    return (False, None) if row is None else (True, row["workflow_id"])


def succeed(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    attempt: int,
    *,
    token: uuid.UUID,
    actor: str,
    now: datetime | None = None,
    result: Any = None,
    started: list[PendingMessage] | None = None,
    chain_ended: bool = False,
) -> bool:
    """running -> succeeded with the body's ``result`` (checked by lifecycle/rules/results.py),
    in the same statement; fenced by the attempt and its claim ``token``; False means the
    lease was lost. No event row where the run row carries the claim: ``finished_at``
    and ``attempted_at`` are the success and its claim (row_events.py reads them back).
    A workflow step's success inserts the steps now due after it; their messages are
    appended to ``started``, for the caller to publish after COMMIT (else the relay
    publishes them). ``chain_ended``: the step's body ended its chain (workflow.succeeded)."""
    ended, workflow_id = _finish(
        conn,
        spec,
        job_id,
        attempt,
        token=token,
        transition=Transition.SUCCEED,
        outcome=Outcome.SUCCEEDED,
        error=None,
        actor=actor,
        now=now,
        result=result,
    )
    # A step replaced by another job (Task.replace) hands nothing on: its replacement, which
    # now stands in its place, does (workflow.replaced).
    if workflow_id is not None and replaced_by(result) is None:
        stepped = workflow.succeeded(conn, job_id, result, actor=actor, chain_ended=chain_ended)
        _started(started, stepped)
    return ended


def fail(
    conn: Connection,
    spec: RunTable,
    job_id: uuid.UUID,
    attempt: int,
    *,
    token: uuid.UUID,
    outcome: Outcome,
    error: str,
    actor: str,
    now: datetime | None = None,
    detail: Mapping[str, Any] | None = None,
    started: list[PendingMessage] | None = None,
) -> bool:
    """running -> failed with ``outcome`` and no result, fenced as ``succeed``; ``detail``
    goes on its event. A workflow step's failure starts its errbacks and blocks what
    waited for it (``started`` as for ``succeed``)."""
    ended, workflow_id = _finish(
        conn,
        spec,
        job_id,
        attempt,
        token=token,
        transition=Transition.FAIL,
        outcome=outcome,
        error=error,
        actor=actor,
        now=now,
        detail=detail,
    )
    if workflow_id is not None:
        _started(started, workflow.failed(conn, job_id, error, actor=actor, now=now))
    return ended


def _started(into: list[PendingMessage] | None, messages: list[PendingMessage]) -> None:
    if into is not None:
        into.extend(messages)


def requeue(
    conn: Connection,
    spec: RunTable,
    run: Run,
    *,
    error: str,
    transition: Transition,
    actor: str,
    delay: timedelta | None = None,
    retry_at: datetime | None = None,
    now: datetime | None = None,
    refund: bool = False,
    detail: Mapping[str, Any] | None = None,
) -> PendingMessage | None:
    """running -> queued for the next attempt, due ``delay`` after the database's now (or
    at ``retry_at``); returns its outbox row.

    ``run`` is the row as claimed (the fence is its ``attempts`` and ``claim_token``).
    ``refund`` (a long Retry-After) raises the ceiling by one, so the pause does not spend
    an attempt while ``attempts`` itself still only grows.
    """
    now = _stamp(conn, now)
    attempt = run.attempts
    due = retry_at or _later(now, delay or timedelta(0))
    params = {
        "r_job_id": run.job_id,
        "r_attempts": attempt,
        "r_claim_token": run.claim_token,
        "r_next_retry_at": due,
        "r_delay": delay or timedelta(0),
        "r_last_error": error,
        "r_now": now,
        "r_refund": int(refund),
    }
    event = Event(spec, attempt, transition, State.RUNNING, State.QUEUED, actor, now, error, detail)
    out = outgoing(spec, run.columns, attempt=attempt + 1, now=now, available_at=due)
    return _run(conn, hot.requeue(spec, conn.dialect.name), params, event, out)[1]
