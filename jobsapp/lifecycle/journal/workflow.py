"""A canvas's steps (``workflow_steps``) and the runs their parents' ends start.

``write_steps`` records a whole canvas in the producer's transaction (lifecycle/workflows/canvas.py
enqueues its first runs in the same one). Then, inside the transaction of a step's
Transition.SUCCEED (finish.py), ``succeeded`` inserts the run of every step that waited
for it and is now due, with its ENQUEUE event and outbox row; inside a Transition.FAIL,
``failed`` inserts the step's errbacks and marks what waited for it blocked; a running step
ended cancelled or expired (a revoke, queued or running; an expiry) blocks the same,
starting no errbacks of its own (``cancelled``).
So no step succeeds (or fails) without its successors (or errbacks) written: they commit
together.

A step's run takes the step's job id, inserted with ON CONFLICT DO NOTHING: a successor
written once is never written again, whatever finishes twice. A chord's body (a step that
waits for several) is inserted once the database says all of them succeeded: the finish
locks the body's step row and counts its success down there (``members_left``); the one
that reaches zero reads its members' run rows, so of two members finishing
at once the second sees the first: each statement of PostgreSQL's READ COMMITTED (the
level of jobsapp's engines) reads what committed before it, the lock's wait included
(docs/workflows.md). SQLite's immediate transactions run one at a time.

``step_runs`` (reads.py) reads the run rows of steps, whatever their run tables (the
chord's results; an operator's cancel of the rest, cancel.py; the workflow view,
monitor/workflows.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cache
from typing import Any

from sqlalchemy import Connection, Table, bindparam, select, update

from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.journal._sql import _require_transaction, upsert_of
from jobsapp.lifecycle.journal.clock import _clock_param, _stamp, clock
from jobsapp.lifecycle.journal.enqueue_one import enqueue_new
from jobsapp.lifecycle.journal.new_run import NewJob
from jobsapp.lifecycle.journal.outbox_rows import LINEAGE, SHADOW, PendingMessage
from jobsapp.lifecycle.journal.reads import load, step_runs
from jobsapp.lifecycle.journal.tables import WorkflowStep
from jobsapp.lifecycle.rules.states import State

STEPS: Table = WorkflowStep.__table__  # type: ignore[assignment]

START, SUCCESS, FAILURE = "start", "success", "failure"
# What a blocked step's handle reports as its outcome; a cancelled step never starts.
UPSTREAM_FAILED, CHORD_FAILED, CANCELLED = "upstream_failed", "chord_failed", "cancelled"


@dataclass(frozen=True)
class Step:
    """One step as the canvas compiler writes it (a ``workflow_steps`` row)."""

    job_id: uuid.UUID
    workflow_id: uuid.UUID
    path: str
    module: str
    task_name: str
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    immutable: bool
    max_attempts: int
    trigger: str
    queue: str | None = None
    priority: int | None = None
    # A job id (as a string), or a nested list of them (a group's results, in order).
    after: Any = None
    next: Sequence[str] = ()
    errbacks: Sequence[str] = ()
    # What the canvas says of the body's root_id, parent_id and group (``lineage``).
    lineage: Mapping[str, str | None] | None = None
    # Seconds its run waits after what it waits for (its own ``countdown``).
    countdown: float | None = None
    # The name its run's messages show (its own ``shadow``; outbox_rows.SHADOW).
    shadow: str | None = None

    def row(self) -> dict[str, Any]:
        """The step's row but its ``created_at`` (the statement's clock)."""
        return {
            "job_id": self.job_id,
            "workflow_id": self.workflow_id,
            "path": self.path,
            "module": self.module,
            "task_name": self.task_name,
            "args": list(self.args),
            "kwargs": dict(self.kwargs),
            "immutable": self.immutable,
            "max_attempts": self.max_attempts,
            "queue": self.queue,
            "priority": self.priority,
            "trigger": self.trigger,
            "after": self.after,
            "next": list(self.next),
            "errbacks": list(self.errbacks),
            "blocked_at": None,
            "blocked_outcome": None,
            "members_left": _members(self.after),
            "lineage": None if self.lineage is None else dict(self.lineage),
            "countdown": self.countdown,
            "shadow": self.shadow,
        }


def body_lineage(step: Mapping[str, Any], by: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the body of ``step`` sees as its ``root_id``, ``parent_id`` and ``group``, as
    Celery's canvas sends them: a first step's are the canvas's; a step started by the end
    of the step ``by`` has it as parent and, unless the canvas named one, its root (a
    chain's later steps root at its first; a chord's body at its last member's root, which
    members sent from outside a task are each their own). None: a step written before
    migration 0031, whose body sees what its message carries."""
    known = step.get("lineage")
    if known is None or by is None:
        return None if known is None else dict(known)
    parent = str(by["job_id"])
    root = known.get("root_id") or (by.get("lineage") or {}).get("root_id") or parent
    return {"root_id": root, "parent_id": parent, "group": known.get("group")}


def _keep_root(conn: Connection, job_id: Any, lineage: Mapping[str, Any]) -> None:
    """The root a step took from the step that started it (a chord's body, from its last
    member), kept on its step row for the steps it starts in turn."""
    known = {"root_id": lineage["root_id"], "group": lineage.get("group")}
    conn.execute(_KEEP_ROOT, {"step": job_id, "lineage": known})


def _members(after: Any) -> int | None:
    """How many a step waiting for several waits for (None for one parent, or none)."""
    return len(set(waited_for(after))) if isinstance(after, list) else None


def write_steps(conn: Connection, steps: Sequence[Step], *, now: datetime | None = None) -> None:
    """Record a canvas; a step already recorded (the same canvas again) stays as it is."""
    _require_transaction(conn, "a workflow's steps")
    if not steps:  # an empty group: nothing to record (no row of defaults)
        return
    at = _stamp(conn, now)
    conn.execute(_write_steps(conn.dialect.name), [{**step.row(), "r_now": at} for step in steps])


@cache
def _write_steps(dialect: str) -> Any:
    """The steps' INSERT, built once: given a list of rows, SQLAlchemy sends them as one
    multi-row statement and compiles it once (a statement built per call with its rows in
    it cost some 30 Python calls a column of each row to compile)."""
    stmt = upsert_of(dialect, STEPS).values(created_at=_clock_param(dialect))
    return stmt.on_conflict_do_nothing(index_elements=[STEPS.c.job_id])


def new_job(
    step: Mapping[str, Any], given: Sequence[Any], lineage: Mapping[str, Any] | None = None
) -> NewJob:
    """The run a step starts as: ``given`` (its parent's result, its members' results, a
    failed step's id) comes before the step's own arguments unless it is immutable; its
    body sees ``lineage`` (``body_lineage``)."""
    spec = registry.get(step["module"])
    assert spec.params_column is not None  # canvas.py takes no other step
    args = list(step["args"]) if step["immutable"] else [*given, *step["args"]]
    job_id = uuid.UUID(str(step["job_id"]))
    params: dict[str, Any] = {"args": args, "kwargs": dict(step["kwargs"])}
    if lineage is not None:
        params[LINEAGE] = dict(lineage)
    if step.get("shadow"):
        params[SHADOW] = step["shadow"]
    return NewJob(
        spec=spec,
        job_id=job_id,
        task_name=step["task_name"],
        # A step's key is its own: a successor never waits on another job's key.
        concurrency_key=f"{step['task_name']}:{job_id}",
        max_attempts=step["max_attempts"],
        values={spec.params_column: params},
        dedup_window=timedelta(0),
        queue=step["queue"],
        priority=step["priority"],
        workflow_id=uuid.UUID(str(step["workflow_id"])),
        # Due that long after the transaction that starts it, as Celery sends a step with
        # its own countdown once what it waits for ended (a canvas's own countdown, given
        # to its first steps by ``start``'s ``due``, comes after and wins, as in Celery).
        delay=timedelta(seconds=step["countdown"]) if step.get("countdown") else None,
        # Its first message's headers say what its body sees, whoever publishes it: the
        # caller of a canvas given a root and parent (its send_task stamps none of them),
        # as beat's relay reads them from the run (kept_headers.py).
        lineage=None if lineage is None else (lineage["root_id"], lineage.get("parent_id")),
    )


def start(
    conn: Connection,
    step: Mapping[str, Any],
    given: Sequence[Any],
    *,
    actor: str,
    due: Callable[[NewJob], NewJob] | None = None,
    by: Mapping[str, Any] | None = None,
) -> PendingMessage | None:
    """Insert the step's run (none -> queued, with its message), unless it has one
    already; returns its message (at the step's queue and priority, from its ``NewJob``,
    when ``due`` says). ``by``: the step row whose end starts it (None: a first step)."""
    if step["blocked_outcome"] == CANCELLED:
        return None
    lineage = body_lineage(step, by)
    job = new_job(step, given, lineage)
    inserted = enqueue_new(conn, job if due is None else due(job), actor=actor)
    if inserted is None or inserted.message is None:
        return None
    if lineage is not None and not step["lineage"].get("root_id"):
        _keep_root(conn, step["job_id"], lineage)
    if step["blocked_at"] is not None:
        _unblock(conn, step["job_id"])
    return inserted.message


def succeeded(
    conn: Connection, job_id: uuid.UUID, result: Any, *, actor: str, chain_ended: bool = False
) -> list[PendingMessage]:
    """In Transition.SUCCEED's transaction: start every step now due after ``job_id``. A
    body that ended its chain (``self.request.chain = None``, Celery's way) starts none of
    the chain's later steps: they end ``cancelled``; its links and a chord it is a member
    of go on, as in Celery."""
    _require_transaction(conn, "a workflow step's success")
    done = _step(conn, job_id)
    if done is None:
        return []
    started = []
    for step in _steps(conn, done["next"], lock=True):
        if chain_ended and _chained_after(step, job_id):
            reason = f"step {job_id} ended its chain"
            _block(conn, step, reason, actor=actor, now=None, cancelled=True)
            continue
        if not _maybe_last(conn, step):
            continue
        value = _given(conn, step["after"], {str(job_id): result})
        if value is not _NOT_YET:
            started.append(start(conn, step, [value], actor=actor, by=done))
    return [message for message in started if message is not None]


def failed(
    conn: Connection, job_id: uuid.UUID, error: str, *, actor: str, now: datetime | None = None
) -> list[PendingMessage]:
    """In Transition.FAIL's transaction (the last attempt): start the step's errbacks, and
    block what waited for it: a chord's body ends ``chord_failed`` and starts its own
    errbacks, as Celery's chord error does; the rest of a chain ``upstream_failed``."""
    _require_transaction(conn, "a workflow step's failure")
    done = _step(conn, job_id)
    if done is None:
        return []
    messages = _errbacks(conn, done, actor=actor)
    return messages + _block_next(conn, done, f"step {job_id} failed: {error}", actor, now)


def cancelled(
    conn: Connection,
    job_id: uuid.UUID,
    *,
    actor: str,
    now: datetime | None = None,
    how: str = "was revoked",
) -> list[PendingMessage]:
    """In the transaction that ends a step cancelled or expired: a running one by its
    worker (a revoke, an operator's cancel: revoking.honour_cancel) or the reaper (reap.py),
    a queued one by its cancel (cancel.py) or expiry (expire.py, ``how``: "expired"). What
    waited for it is blocked as a failure blocks it (a chord's body ``chord_failed``,
    starting the body's errbacks, as Celery's backend fails a chord whose member was revoked
    or expired; the rest of a chain ``upstream_failed``, so a replay of the step resumes
    it), but the step's own errbacks do not run: Celery's ``mark_as_revoked`` calls none."""
    _require_transaction(conn, "a workflow step's cancel")
    done = _step(conn, job_id)
    if done is None:
        return []
    return _block_next(conn, done, f"step {job_id} {how}", actor, now)


class StepRevoke(StrEnum):
    BLOCKED = "blocked"  # it had no run: none will be written
    HAS_RUN = "has run"  # its run was written first: revoke the run
    NO_STEP = "no step"  # no step has this job id


def revoke_unstarted(
    conn: Connection,
    job_id: uuid.UUID,
    reason: str,
    *,
    actor: str,
    started: list[PendingMessage],
) -> StepRevoke:
    """A revoke of a step whose run is not written yet (a chain's later step, a chord's
    body, an errback), kept in the journal as a revoked run is: the step is blocked
    ``cancelled`` under its lock, so the end it waits for never starts it (``start``, which
    takes the same lock first), not even a replay's, and what waits for it is blocked as
    a revoked run's end blocks it (``cancelled``; its messages join ``started``)."""
    _require_transaction(conn, "a step's revoke")
    found = _steps(conn, [str(job_id)], lock=True)
    if not found:
        return StepRevoke.NO_STEP
    step = found[0]
    if load(conn, registry.get(step["module"]), job_id) is not None:
        return StepRevoke.HAS_RUN
    stmt = (
        update(STEPS)
        .where(STEPS.c.job_id == job_id, STEPS.c.blocked_outcome.is_distinct_from(CANCELLED))
        .values(blocked_at=clock(conn), blocked_outcome=CANCELLED, blocked_reason=reason)
    )
    if conn.execute(stmt).rowcount == 1:
        started += _block_next(conn, step, f"step {job_id} was revoked", actor, None)
    return StepRevoke.BLOCKED


def _block_next(
    conn: Connection, done: Mapping[str, Any], reason: str, actor: str, now: datetime | None
) -> list[PendingMessage]:
    """Block what waits for the step ``done``, which will not succeed."""
    messages = []
    for step in _steps(conn, done["next"]):
        messages += _block(conn, step, reason, actor=actor, now=now)
    return messages


def replaced(conn: Connection, job_id: uuid.UUID, steps: Sequence[Step], out: str) -> list[Step]:
    """Task.replace of the step ``job_id`` by ``steps`` (of its workflow) that end in
    ``out``, in the replaced run's success transaction: what waited for the step (its
    successors, a chord's body, its errbacks) waits for ``out`` instead, and ``out`` starts
    them. Returns ``steps`` to write, ``out`` carrying the step's successors and errbacks."""
    _require_transaction(conn, "a step's replacement")
    done = _steps(conn, [str(job_id)], lock=True)[0]
    for waiting in _steps(conn, [*done["next"], *done["errbacks"]], lock=True):
        after = _renamed(waiting["after"], str(job_id), out)
        conn.execute(update(STEPS).where(STEPS.c.job_id == waiting["job_id"]).values(after=after))
    return [
        replace(s, next=(*s.next, *done["next"]), errbacks=(*s.errbacks, *done["errbacks"]))
        if str(s.job_id) == out
        else s
        for s in steps
    ]


def _renamed(after: Any, old: str, new: str) -> Any:
    if isinstance(after, list):
        return [_renamed(item, old, new) for item in after]
    return new if after is not None and str(after) == old else after


@dataclass(frozen=True, slots=True)
class Blocked:
    """A workflow step that will not run (what it waited for failed) and so has no run
    row: the failed run its readers see, with the fields of ``Run`` they read."""

    job_id: uuid.UUID
    task_name: str
    outcome: str | None
    last_error: str | None
    finished_at: datetime | None
    state: str = State.FAILED.value
    attempts: int = 0
    result: Any = None
    worker: str | None = None
    queue: str | None = None

    @property
    def columns(self) -> dict[str, Any]:
        """As a handle's ``row()`` shows it: the run row's names of what it has."""
        names = ("job_id", "task_name", "state", "outcome", "last_error", "attempts")
        return {name: getattr(self, name) for name in (*names, "result", "finished_at")}


def blocked(conn: Connection, job_id: uuid.UUID) -> Blocked | None:
    """A blocked step with no run, as the failed run a handle reads (None otherwise)."""
    step = _step(conn, job_id)
    if step is None or step["blocked_at"] is None:
        return None
    return Blocked(
        job_id,
        step["task_name"],
        step["blocked_outcome"],
        step["blocked_reason"],
        step["blocked_at"],
    )


def steps_of(conn: Connection, workflow_id: uuid.UUID) -> list[dict[str, Any]]:
    """Every step row of a workflow (``GroupResult.restore`` rebuilds its handles)."""
    stmt = select(STEPS).where(STEPS.c.workflow_id == workflow_id)
    return [dict(row) for row in conn.execute(stmt).mappings()]


def step_rows(conn: Connection, ids: Iterable[str]) -> list[dict[str, Any]]:
    """The step rows of ``ids`` (job ids), in that order; an id of no step is left out."""
    return _steps(conn, ids)


def canvas_order(row: Mapping[str, Any]) -> list[tuple[int, str]]:
    """A step's path ("0.1.h.10") in canvas order: numbers as numbers."""
    return [(int(p), "") if p.isdigit() else (-1, p) for p in str(row["path"]).split(".")]


def waited_on(conn: Connection, job_id: uuid.UUID) -> list[str]:
    """The job ids the step ``job_id`` waits for (none for a first step or no step)."""
    step = _step(conn, job_id)
    return [] if step is None else list(waited_for(step["after"]))


def _errbacks(conn: Connection, step: Mapping[str, Any], *, actor: str) -> list[PendingMessage]:
    """Celery's old-style errback call: the failed task's id first. Locked, as a success's
    successors are, so an errback's revoke (``revoke_unstarted``) comes before or after."""
    started = [
        start(conn, errback, [str(step["job_id"])], actor=actor, by=step)
        for errback in _steps(conn, step["errbacks"], lock=True)
    ]
    return [message for message in started if message is not None]


def _chained_after(step: Mapping[str, Any], job_id: uuid.UUID) -> bool:
    """``step`` is the next task of ``job_id``'s chain: it waits for that step alone and is
    not one of its links (``link`` callbacks, which Celery sends whatever the chain)."""
    return step["after"] == str(job_id) and not step["path"].rpartition(".")[2].startswith("link")


def _block(
    conn: Connection,
    step: Mapping[str, Any],
    reason: str,
    *,
    actor: str,
    now: datetime | None,
    cancelled: bool = False,
) -> list[PendingMessage]:
    """Mark ``step`` and what waits on it blocked (once: a guarded update): ``cancelled``,
    else as a failure upstream makes it; a chord's body failed so starts its errbacks,
    once."""
    chord = isinstance(step["after"], list)
    outcome = CANCELLED if cancelled else CHORD_FAILED if chord else UPSTREAM_FAILED
    stmt = (
        update(STEPS)
        .where(STEPS.c.job_id == step["job_id"], STEPS.c.blocked_at.is_(None))
        .values(blocked_at=clock(conn, now), blocked_outcome=outcome, blocked_reason=reason)
    )
    if conn.execute(stmt).rowcount != 1:
        return []
    messages = _errbacks(conn, step, actor=actor) if chord and not cancelled else []
    for later in _steps(conn, step["next"]):
        messages += _block(conn, later, reason, actor=actor, now=now, cancelled=cancelled)
    return messages


def _maybe_last(conn: Connection, step: Mapping[str, Any]) -> bool:
    """One of the members ``step`` waits for succeeded (``step`` locked): count it, and
    say whether it may be the last, whose finish reads every member's result. Reaching
    zero is not proof (a member rerun after its success counts twice): the run rows
    decide then, at every later success too."""
    if step["members_left"] is None:
        return True
    left = conn.execute(_COUNT_DOWN, {"step": step["job_id"]}).scalar()
    return left is None or left == 0


def _unblock(conn: Connection, job_id: Any) -> None:
    """A replayed step succeeded after all: what waited for it runs after all."""
    conn.execute(
        update(STEPS)
        .where(STEPS.c.job_id == job_id, STEPS.c.blocked_at.is_not(None))
        .values(blocked_at=None, blocked_outcome=None, blocked_reason=None)
    )


def _step(conn: Connection, job_id: uuid.UUID) -> dict[str, Any] | None:
    return next(iter(_steps(conn, [str(job_id)])), None)


# Built once (every step's end reads its step and its successors': a statement built per
# call cost more Python than the rest of the read).
_STEPS_OF = select(STEPS).where(STEPS.c.job_id.in_(bindparam("ids", expanding=True)))
_LOCKED_STEPS_OF = _STEPS_OF.order_by(STEPS.c.job_id).with_for_update()
# A chord member's success counted down on its body's step (every member's).
_COUNT_DOWN = (
    update(STEPS)
    .where(STEPS.c.job_id == bindparam("step", type_=STEPS.c.job_id.type), STEPS.c.members_left > 0)
    .values(members_left=STEPS.c.members_left - 1)
    .returning(STEPS.c.members_left)
)


_KEEP_ROOT = (
    update(STEPS)
    .where(STEPS.c.job_id == bindparam("step", type_=STEPS.c.job_id.type))
    .values(lineage=bindparam("lineage", type_=STEPS.c.lineage.type))
)


def _steps(conn: Connection, ids: Iterable[str], *, lock: bool = False) -> list[dict[str, Any]]:
    """The step rows of ``ids``, in that order; ``lock`` holds them to the commit, so two
    members of one chord finishing at once decide about its body one after the other."""
    wanted = [uuid.UUID(str(i)) for i in ids]
    if not wanted:
        return []
    stmt = _LOCKED_STEPS_OF if lock else _STEPS_OF
    found = {row.job_id: row._asdict() for row in conn.execute(stmt, {"ids": wanted})}
    return [found[i] for i in wanted if i in found]


class _NotYet:
    """A member of a chord that has not succeeded (yet)."""


_NOT_YET: Any = _NotYet()


def _given(conn: Connection, after: Any, known: Mapping[str, Any]) -> Any:
    """What a step waiting for ``after`` is given: the result of the step it names, or
    the list of its members' results in order; _NOT_YET while one has not succeeded."""
    ids = list(waited_for(after))
    missing = [i for i in ids if i not in known]
    results = {**_results(conn, missing), **known}
    if any(i not in results for i in ids):
        return _NOT_YET
    return _shaped(after, results)


def waited_for(after: Any) -> Iterator[str]:
    """The job ids a step's ``after`` names, in order (none for a first step)."""
    if isinstance(after, list):
        for item in after:
            yield from waited_for(item)
    elif after is not None:
        yield str(after)


def _shaped(after: Any, results: Mapping[str, Any]) -> Any:
    if isinstance(after, list):
        return [_shaped(item, results) for item in after]
    return results[str(after)]


def _results(conn: Connection, ids: Sequence[str]) -> dict[str, Any]:
    """The results of those of ``ids`` whose runs succeeded, read from their run rows."""
    runs = step_runs(conn, _steps(conn, ids), "result", state=State.SUCCEEDED)
    return {str(job_id): run.result for job_id, run in runs.items()}
