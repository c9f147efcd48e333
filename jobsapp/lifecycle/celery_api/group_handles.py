"""What the caller of a lifecycle canvas gets back: a step's ``AsyncResult`` whose
``parent`` is what it waited for, a group's ``GroupResult``, and ``GroupResult.restore``
of a group from its workflow's steps (the result backend's ``_restore_group``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from celery._state import get_current_worker_task
from celery.result import GroupResult

from jobsapp.db import get_engine
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.celery_api.backend import for_app
from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.journal import EnqueueOutcome, registry, workflow
from jobsapp.lifecycle.journal.workflow import FAILURE

R = TypeVar("R")
# A canvas node's output: a step's job id, or a group's members' outputs.
Output = str | list[Any]


class StepHandle(JobHandle):
    """A step's handle: its run row once it has one; before that, a step that will not run
    (what it waited for failed) answers as a failed job, raising what Celery raises (the
    failed step's exception; ``ChordError`` for a chord's body)."""

    def __init__(self, *args: Any, workflow_id: uuid.UUID | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.workflow_id = workflow_id

    def row(self) -> Mapping[str, Any] | None:
        with get_engine().connect() as conn:
            run = journal.load(conn, self.spec, self.job_id)
            if run is not None:
                return run.columns
            stand_in = workflow.blocked(conn, self.job_id)
            return None if stand_in is None else stand_in.columns


class GroupHandle(GroupResult):
    """Celery's ``GroupResult`` of a lifecycle group; its id is its workflow's, which the
    journal keeps, so ``save()`` has nothing to write and ``GroupResult.restore(id)``
    rebuilds it from the workflow's steps."""

    def __init__(
        self, workflow_id: uuid.UUID, results: Sequence[Any], *, app: Any = None, parent: Any = None
    ) -> None:
        super().__init__(str(workflow_id), list(results), parent=parent, app=app)
        self.workflow_id = workflow_id

    def save(self, backend: Any = None) -> Any:
        return (backend or for_app(self.app)).save_group(str(self.workflow_id), self)


@dataclass(frozen=True)
class Node:
    """What a handle needs of a step (from a ``Step`` or a ``workflow_steps`` row)."""

    job_id: uuid.UUID
    module: str
    task_name: str
    after: Any


def handle_of(app: Any, out: Output, nodes: Mapping[str, Node], workflow_id: uuid.UUID) -> Any:
    """Celery's result of the canvas node ``out``: a step's handle whose ``parent`` is what
    it waited for, or a group's ``GroupResult`` of its members."""
    if isinstance(out, list):
        members = [handle_of(app, o, nodes, workflow_id) for o in out]
        return GroupHandle(workflow_id, members, app=app, parent=_descended_from(members))
    node = nodes[out]
    parent = None if node.after is None else handle_of(app, node.after, nodes, workflow_id)
    return StepHandle(
        node.job_id,
        EnqueueOutcome.ENQUEUED,
        registry.get(node.module),
        task=node.task_name,
        workflow_id=workflow_id,
        app=app,
        parent=parent,
    )


def trailed(result: R, wanted: Any) -> R:
    """``result`` of a call, kept among the ``children`` of the task whose body made it
    (unless ``wanted``, Celery's ``add_to_parent``, is false), as Celery's ``add_trail``
    keeps what a canvas publishes itself: a chain's first task (a chord's header, if it
    starts with one), a group's or a chord header's result."""
    parent = get_current_worker_task()
    if wanted and parent is not None:
        *_, first = [result, *_parents(result)]
        parent.add_trail(first)
    return result


def _descended_from(members: Sequence[Any]) -> Any:
    """A group's ``parent`` as Celery's chain gives it: the step before the group (before
    a chord's header), the nearest result every member's line of parents passes through;
    None for a group nothing ran before."""
    lines = [list(_parents(member)) for member in members]
    if not lines:
        return None
    others = [{_identity(p) for p in line} for line in lines[1:]]
    return next((p for p in lines[0] if all(_identity(p) in seen for seen in others)), None)


def _identity(result: Any) -> Any:
    """A result on a line of parents: a step's id; a group's members' (every group of a
    workflow answers to its workflow's id)."""
    if isinstance(result, GroupResult):
        return tuple(_identity(r) for r in result.results or ())
    return str(result.id)


def _parents(result: Any) -> Iterator[Any]:
    node = result.parent
    while node is not None:
        yield node
        node = node.parent


def restore_group(app: Any, group_id: str) -> GroupHandle | None:
    """``GroupResult.restore(id)`` of a lifecycle group: the workflow's outputs (the steps
    nothing runs after, in canvas order); None when no workflow has that id."""
    try:
        workflow_id = uuid.UUID(str(group_id))
    except ValueError:
        return None
    with get_engine().connect() as conn:
        rows = workflow.steps_of(conn, workflow_id)
    if not rows:
        return None
    nodes = {
        str(r["job_id"]): Node(r["job_id"], r["module"], r["task_name"], r["after"]) for r in rows
    }
    outputs = [
        str(r["job_id"])
        for r in sorted(rows, key=workflow.canvas_order)
        if not r["next"] and r["trigger"] != FAILURE
    ]
    return GroupHandle(
        workflow_id, [handle_of(app, o, nodes, workflow_id) for o in outputs], app=app
    )
