"""Celery's ``Task.replace(sig)`` in the journal: a running job hands its answer to a new job.

The new job's row and the running run's success commit in one transaction, fenced by the
running attempt's claim; the success keeps a mark naming the new job as its result. A crash
before that commit leaves neither (the attempt runs again and replaces again), after it
both (the relay publishes the new job if the fast path did not). The new job's id is a
function of the replaced job's, so replacing the same job twice names one new job.

Celery's results follow the mark (``results.replaced_by``, read by ``backend.py``):
``AsyncResult(id).get()`` of the replaced job answers the new job's value or raises its
exception, as Celery's replacement answers under the task id it inherits. A chain or a chord
replaces as its last step (its steps written in the same transaction). A step of a workflow
is replaced in place: the replacement's steps join its workflow, and what waited for the
step (the rest of a chain, a chord's body, its errbacks) waits for the replacement's last
step instead, as Celery appends a chain's rest to the replacement. Refused in one line: a
group, or a canvas ending in one (Celery turns it into a chord with a body of its own:
write that chord).
"""

from __future__ import annotations

import uuid
from typing import Any, NoReturn

from celery import Celery
from celery.canvas import Signature, group

from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import workflow
from jobsapp.lifecycle.producer import enqueue, newjob
from jobsapp.lifecycle.rules.errors import Replaced
from jobsapp.lifecycle.rules.results import REPLACED_MARK
from jobsapp.lifecycle.worker.context import RunContext, current_run_or_none
from jobsapp.lifecycle.workflows import canvas

_NAMESPACE = uuid.UUID("0c4b7f3e-9d7a-4c1e-8a35-5f2e6d9b1a07")
_OPTIONS = frozenset(
    {"queue", "priority", "countdown", "eta", "expires", "time_limit", "soft_time_limit"}
)


def successor_of(job_id: uuid.UUID) -> uuid.UUID:
    """The id of the job that replaces ``job_id``: the same for every attempt."""
    return uuid.uuid5(_NAMESPACE, str(job_id))


def replace(app: Celery, name: str, sig: Any, task: Any) -> NoReturn:
    """The body of task ``name`` in a worker calls ``self.replace(sig)``; ``task`` is the
    lifecycle task ``sig`` names, None if it names none. Ends the body with ``Replaced``
    once the hand-over is written; what cannot be replaced is refused with one line (a
    ``TypeError``, never retried)."""
    ctx = current_run_or_none()
    why = refusal(sig, ctx)
    if why is None and sig.subtask_type is None and task is None:
        why = "the replacement must be a lifecycle task's signature"
    if why is not None or ctx is None:
        raise TypeError(f"{name}.replace: {why}")
    try:
        successor = hand_over(app, ctx, task, sig)
    except TypeError as refused:
        raise TypeError(f"{name}.replace: {refused}") from None
    raise Replaced(ctx.job_id, successor)


def refusal(sig: Any, ctx: RunContext | None) -> str | None:
    """Why the running body cannot be replaced by ``sig`` here, if it cannot."""
    if ctx is None:
        return "only the body of a running job can be replaced"
    if not isinstance(sig, Signature):
        return f"the replacement must be a signature, not {type(sig).__name__}"
    if isinstance(sig, group):
        return "a group cannot answer for one job: make it a chord whose body takes the list"
    if sig.subtask_type is None and (unknown := sorted(set(sig.options) - _OPTIONS)):
        return f"the replacement's options {unknown} are not supported"
    return None


def hand_over(app: Celery, ctx: RunContext, task: Any, sig: Signature) -> uuid.UUID:
    """Write ``sig`` as the job (or the workflow) that answers for ``ctx``'s, and ``ctx``'s
    success, at once; returns the job whose answer is now ``ctx``'s."""
    if sig.subtask_type is not None or ctx.row.workflow_id is not None:
        return _to_workflow(app, ctx, sig)
    options = sig.options
    job = newjob.scheduled(
        task.new_job(tuple(sig.args), dict(sig.kwargs), successor_of(ctx.job_id)),
        countdown=options.get("countdown"),
        eta=options.get("eta"),
        headers=None,
        queue=options.get("queue"),
        priority=options.get("priority"),
        expires=options.get("expires"),
        time_limit=options.get("time_limit"),
        soft_time_limit=options.get("soft_time_limit"),
    )
    with ctx.completing(result={REPLACED_MARK: str(job.job_id)}) as conn:
        written = journal.enqueue(conn, job, actor=ctx.worker)
    enqueue.publish_committed(app, [(job, written)])
    return job.job_id


def _to_workflow(app: Celery, ctx: RunContext, sig: Signature) -> uuid.UUID:
    """A chain or chord, or any replacement of a workflow's step: its steps written with
    ``ctx``'s success; its last step answers, and takes the replaced step's place in its
    workflow (what waited for that step waits for it: workflow.replaced)."""
    if not canvas.is_lifecycle_canvas(sig):
        raise TypeError("the replacement must be lifecycle tasks")
    workflow_id = ctx.row.workflow_id
    into = None if workflow_id is None else (workflow_id, f"{ctx.job_id}.r")
    options = {"task_id": str(successor_of(ctx.job_id))}
    _, out, steps = canvas.compiled(sig, None, options, into=into)
    if not isinstance(out, str):
        raise TypeError("a canvas ending in a group cannot answer for one job: end it in a chord")
    with ctx.completing(result={REPLACED_MARK: out}) as conn:
        if workflow_id is not None:
            steps = workflow.replaced(conn, ctx.job_id, steps, out)
        messages = canvas.write(conn, steps)
    canvas.publish(app, messages)
    return uuid.UUID(out)
