"""Celery's canvas (chain, group, chord, link, link_error) on lifecycle tasks, kept in the
journal (docs/workflows.md).

A canvas of lifecycle tasks is compiled, before Celery dispatches anything, into steps
(``journal.workflow.Step``): one per signature, its job id derived from the workflow id and
its place in the canvas, each naming what it waits for. The steps and the first runs are
written in one transaction; every later run is written by the transaction that records
the success (or failure) it waits for. Celery's own dispatch of ``chain``, ``group`` and
``chord`` (a chord needs a result backend and polls with ``chord_unlock``) is kept for
canvases of plain Celery tasks: ``install`` wraps their ``apply_async`` so that a canvas
whose tasks are all lifecycle tasks comes here, one without any goes to Celery unchanged,
and one mixing both is refused with a line naming the plain task. ``install`` runs when a
lifecycle task joins an app (``lifecycle_task``, ``LifecycleTask.on_bound``), never at
an import: Celery's own dispatch of a chord or group needs a result backend, so its hooks
(``Task.apply_async(chain=...)``, the backend's ``apply_chord``) cannot take the canvas
whole yet (docs/workflows.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

from celery.canvas import Signature, _chain, chord, group, maybe_signature
from sqlalchemy import Connection

from jobsapp.db import get_engine
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.celery_api import errback
from jobsapp.lifecycle.celery_api.group_handles import Node, Output, handle_of, trailed
from jobsapp.lifecycle.journal import NewJob, PendingMessage, workflow
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.journal.workflow import FAILURE, START, SUCCESS, Step, waited_for
from jobsapp.lifecycle.producer import newjob
from jobsapp.lifecycle.rules import message
from jobsapp.lifecycle.rules.errors import ArgumentRefused
from jobsapp.lifecycle.rules.results import NotJson, hint, non_json, stored_arguments
from jobsapp.lifecycle.transport import outbox
from jobsapp.settings import get_settings

# What a signature in a lifecycle canvas may carry besides its arguments.
_KNOWN_OPTIONS = frozenset(
    {"queue", "priority", "task_id", "link", "link_error", "countdown", "shadow"}
)
# What Celery's freeze() adds to a step that changes nothing here: where its RPC backend
# would send the value, its place in its group (a group's steps keep their order) and, in
# a chord's header, the chord's body (the workflow's steps hold it).
_FROZEN_OPTIONS = frozenset({"reply_to", "group_index", "chord"})
# A whole canvas's apply_async options: a step's, when its first tasks are due, and whom
# they descend from (Celery's backend sends a failure's errbacks as a group with both).
_CANVAS_OPTIONS = _KNOWN_OPTIONS | {"countdown", "eta", "root_id", "parent_id"}
# A whole canvas's options its first tasks take over their own, as Celery passes them on.
_ROUTING = ("queue", "priority", "shadow")
_WORKFLOW_NAMESPACE = uuid.UUID("6f1d7c4e-3b57-4a8e-9a54-3c1f0e1d2b77")


class MixedCanvas(TypeError):
    """A canvas mixing lifecycle tasks and plain Celery tasks."""


def lifecycle_table(task: Any) -> RunTable | None:
    """The run table of a lifecycle task (None for a plain Celery task)."""
    table = getattr(task, "run_table", None)
    return table if isinstance(table, RunTable) else None


# --- which canvases are ours ---------------------------------------------------------------


def _leaves(sig: Signature) -> Iterator[Signature]:
    """Every task signature of a canvas, callbacks and errbacks included."""
    if isinstance(sig, chord):
        yield from _leaves(_as_group(sig.tasks))
        yield from _leaves(sig.body)
    elif isinstance(sig, (group, _chain)):
        for task in sig.tasks:
            yield from _leaves(_signature(task, sig))
    else:
        yield sig
    for name in ("link", "link_error"):
        for callback in _callbacks(sig, name):
            yield from _leaves(callback)


def _task_of(sig: Signature) -> Any:
    try:
        return sig.type
    except KeyError:  # a name no task of this process has: sent by name, a plain task
        return None


def is_lifecycle_canvas(sig: Signature) -> bool:
    """True when every task of the canvas is a lifecycle task, False when none is;
    MixedCanvas names the first plain task of a canvas mixing both."""
    kinds = [(leaf.task, lifecycle_table(_task_of(leaf)) is not None) for leaf in _leaves(sig)]
    plain = [name for name, ours in kinds if not ours]
    if not plain:
        return True
    if len(plain) == len(kinds):
        return False
    raise MixedCanvas(
        f"{plain[0]} is a plain Celery task in a canvas of lifecycle tasks: "
        "make it a lifecycle task, or run it in a canvas of its own"
    )


# --- compiling a canvas into steps ---------------------------------------------------------


@dataclass
class _Draft:
    """A step while the canvas is compiled: later steps add to its next and errbacks."""

    step: dict[str, Any]
    next: list[str] = field(default_factory=list)
    errbacks: list[str] = field(default_factory=list)


# What a node of the canvas gives what follows it: a step's job id, or a group's list.


@dataclass
class Compiler:
    """Turns one canvas into ``Step`` rows of one workflow."""

    workflow_id: uuid.UUID
    # Whom the canvas's first tasks descend from (a root, a parent; either may be None):
    # the task whose body sends it (its root_id, its id), as Celery's send_task reads it,
    # or the root and parent its apply_async names.
    sender: newjob.GivenLineage | None = None
    # The step whose task's ``shadow_name`` the caller asked already (a task's own
    # ``apply_async(link=...)``: its step), which Celery asks once a call.
    asked: str | None = None
    drafts: dict[str, _Draft] = field(default_factory=dict)

    def steps(self) -> list[Step]:
        return [
            Step(**d.step, next=tuple(d.next), errbacks=tuple(d.errbacks))
            for d in self.drafts.values()
        ]

    def node(
        self,
        sig: Signature,
        path: str,
        after: Output | None,
        args: tuple[Any, ...],
        errbacks: tuple[Signature, ...] = (),
        routing: Mapping[str, Any] | None = None,
        in_group: bool = False,
    ) -> Output:
        """Compile ``sig`` at ``path``, waiting for ``after`` (None: runs at once), its
        first tasks given ``args`` (apply_async's partial arguments) first and ``routing``
        (its queue, priority and shadow) over their own, as Celery gives a canvas's options: a
        group's members, a chain's first task, a chord's header and body. A task
        ``in_group`` (a group's member, a chord's body; of a chain there, its last task)
        carries the group's id, as in Celery: its workflow's, which every group handle of
        the workflow answers to."""
        errbacks = (*errbacks, *_callbacks(sig, "link_error"))
        if isinstance(sig, chord):
            header = self.node(_as_group(sig.tasks), f"{path}.h", after, args, (), routing)
            out = self.node(sig.body, f"{path}.body", header, (), errbacks, routing, True)
        elif isinstance(sig, group):
            out = [
                self.node(member, f"{path}.{i}", after, args, own, routing, True)
                for i, (member, own) in enumerate(_unrolled(sig, errbacks))
            ]
        elif isinstance(sig, _chain):
            out = self._chain(sig, path, after, (*args, *sig.args), errbacks, routing, in_group)
        else:
            out = self._task(sig, path, after, args, errbacks, routing, in_group)
        for i, callback in enumerate(_callbacks(sig, "link")):
            self.node(callback, f"{path}.link{i}", _single(out, sig), ())
        return out

    def _chain(
        self,
        sig: _chain,
        path: str,
        after: Output | None,
        args: tuple[Any, ...],
        errbacks: tuple[Signature, ...],
        routing: Mapping[str, Any] | None,
        in_group: bool,
    ) -> Output:
        out, last = after, len(sig.tasks) - 1
        for i, task in enumerate(sig.tasks):
            step = _signature(task, sig)
            out = self.node(
                step, f"{path}.{i}", out, args, errbacks, routing, in_group and i == last
            )
            args, routing = (), None
        assert out is not None  # a chain of no task is refused by Celery itself
        return out

    def _task(
        self,
        sig: Signature,
        path: str,
        after: Output | None,
        args: tuple[Any, ...],
        errbacks: tuple[Signature, ...],
        routing: Mapping[str, Any] | None,
        in_group: bool,
    ) -> str:
        waits = after is not None and any(True for _ in waited_for(after))
        job_id = self._add(sig, path, after, args, SUCCESS if waits else START, routing)
        if in_group:
            self.drafts[job_id].step["lineage"]["group"] = str(self.workflow_id)
        for previous in waited_for(after):
            self.drafts[previous].next.append(job_id)
        for i, on_error in enumerate(errbacks):
            self.drafts[job_id].errbacks.append(self._errback(on_error, f"{path}.err{i}", job_id))
        return job_id

    def _errback(self, sig: Signature, path: str, failing: str) -> str:
        if not type(sig) is Signature:  # noqa: E714 - a canvas class is a Signature too
            raise TypeError(f"link_error takes a task's signature, not a {type(sig).__name__}")
        job_id = self._add(sig, path, failing, (), FAILURE)
        if not sig.immutable and errback.is_new_style(sig.type):
            self.drafts[job_id].step["kwargs"][errback.MARK] = True
        return job_id

    def _add(
        self,
        sig: Signature,
        path: str,
        after: Output | None,
        args: tuple[Any, ...],
        trigger: str,
        routing: Mapping[str, Any] | None = None,
    ) -> str:
        task = sig.type
        spec = lifecycle_table(task)
        assert spec is not None  # is_lifecycle_canvas checked every task
        options = {**_options(sig), **(routing or {})}
        job_id = self._job_id(options, path)
        given = sig.args if sig.immutable else (*args, *sig.args)
        ask = (trigger == START or sig.immutable) and path != self.asked
        call = _require_arguments(str(sig.task), spec, given, sig.kwargs)
        self.drafts[job_id] = _Draft(
            {
                "job_id": uuid.UUID(job_id),
                "workflow_id": self.workflow_id,
                "path": path,
                "module": spec.module,
                "task_name": sig.task,
                "args": call["args"],
                "kwargs": call["kwargs"],
                "immutable": bool(sig.immutable),
                "max_attempts": task.max_attempts,
                "trigger": trigger,
                "after": after,
                "queue": newjob.queue_name(str(sig.task), options.get("queue"))
                or getattr(task, "queue", None),
                "priority": _priority(options, task),
                "lineage": self._lineage(job_id, None if trigger == START else after),
                "countdown": _countdown(options.get("countdown")),
                "shadow": _shadow(task, sig, given, options, ask)
                if "shadow" in options or task.names_calls
                else None,
            }
        )
        return job_id

    def _lineage(self, job_id: str, after: Output | None) -> dict[str, str | None]:
        """A step's lineage as the canvas knows it (``workflow.body_lineage`` completes it
        when a step's end starts it): a first task (``after`` None) descends from the
        sender, or is its own root; a later one roots where all it waits for root (a
        chain's first task), else (a chord's members each their own root) where the one
        that starts it does."""
        if after is None:
            root, parent = self.sender or (None, None)
            return {"root_id": root or job_id, "parent_id": parent, "group": None}
        if isinstance(after, str):  # a chain's step, an errback: the common case, no walk
            return {"root_id": self.drafts[after].step["lineage"]["root_id"], "group": None}
        roots = {self.drafts[p].step["lineage"]["root_id"] for p in waited_for(after)}
        return {"root_id": roots.pop() if len(roots) == 1 else None, "group": None}

    def _job_id(self, options: Mapping[str, Any], path: str) -> str:
        """The caller's task id if the signature names one, else one derived from the
        workflow and the step's place: the same canvas again is the same steps."""
        if options.get("task_id"):
            return str(message.job_id_of_task(str(options["task_id"])))
        return str(uuid.uuid5(self.workflow_id, path))


def _signature(item: Any, within: Signature) -> Signature:
    """A member or callback of ``within`` as a signature (a dict once serialized)."""
    sig = maybe_signature(item, app=within.app)
    assert isinstance(sig, Signature)
    return sig


def _unrolled(
    sig: group, errbacks: tuple[Signature, ...]
) -> list[tuple[Signature, tuple[Signature, ...]]]:
    """A group's members with their errbacks, a member that is a group itself unrolled in
    its place, as Celery's group unrolls one: a single flat list of results, in order."""
    members: list[tuple[Signature, tuple[Signature, ...]]] = []
    for item in sig.tasks:
        member = _signature(item, sig)
        if not isinstance(member, group):
            members.append((member, errbacks))
            continue
        if _callbacks(member, "link"):
            _single([], member)  # refused, as a callback linked to any group is
        members += _unrolled(member, (*errbacks, *_callbacks(member, "link_error")))
    return members


def _as_group(tasks: Any) -> group:
    return tasks if isinstance(tasks, group) else group(tasks)


def _callbacks(sig: Signature, name: str) -> list[Signature]:
    return [_signature(s, sig) for s in sig.options.get(name) or ()]


def _single(out: Output, sig: Signature) -> str:
    if isinstance(out, list):
        raise TypeError(f"cannot link a callback to {type(sig).__name__}: use a chord")
    return out


def _options(sig: Signature) -> Mapping[str, Any]:
    unknown = sorted(set(sig.options) - _KNOWN_OPTIONS - _FROZEN_OPTIONS)
    if unknown:
        raise TypeError(
            f"{sig.task} in a canvas: jobsapp does not support {unknown} on a "
            f"step (a step takes {sorted(_KNOWN_OPTIONS)})"
        )
    return sig.options


def _shadow(
    task: Any, sig: Signature, args: Sequence[Any], options: Mapping[str, Any], ask: bool
) -> str | None:
    """A step's display name: its own ``shadow``, else what its task's ``shadow_name`` makes
    of the call, asked as Celery asks it when it sends the step. Asked here, where the
    canvas is written (``ask``), only of a step whose arguments are whole by then (a first
    step, an immutable one): a step given what it waits for is sent by the journal, which
    does not call a team's code in the transaction that starts it, and shows its task's
    name; nor of the step the caller's ``apply_async`` asked (``Compiler.asked``)."""
    shadow = options.get("shadow")
    if shadow is not None:
        newjob.require_name(f"{sig.task} in a canvas", shadow)
    if shadow or not (ask and task.names_calls):
        return shadow
    own = {k: v for k, v in options.items() if k not in _NOT_ASKED}
    named: str | None = task.shadow_name(tuple(args), dict(sig.kwargs), own)
    return named


# What Celery's ``apply_async`` takes by name, so never gives its ``shadow_name``.
_NOT_ASKED = frozenset({"task_id", "link", "link_error", "shadow"})


def _countdown(given: Any) -> float | None:
    """A step's own countdown, in seconds: none, or a number not ahead, is no delay;
    anything else but seconds up to a year is refused here, before the canvas is written
    (an infinite one would fail every start of the step, in its predecessor's success)."""
    if isinstance(given, int | float) and not given > 0:
        return None
    return newjob.bounded_seconds("countdown", given)


def _priority(options: Mapping[str, Any], task: Any) -> int | None:
    given = options.get("priority")
    return int(given) if given is not None else getattr(task, "priority", None)


def _require_arguments(
    name: str, spec: RunTable, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """A step's arguments as its run's JSON column keeps them (``results.stored_arguments``:
    kombu's encoding, within ``JOBSAPP_ARGS_MAX_BYTES``); only tasks of the jobs table take
    them, and only values Celery's JSON serializer carries."""
    if spec.params_column is None:
        raise TypeError(
            f"{name} takes the ids of a {spec.module} run, not a canvas step's "
            "arguments: only tasks of the jobs table run in a canvas"
        )
    call = {"args": list(args), "kwargs": dict(kwargs)}
    try:
        kept: dict[str, Any] = stored_arguments(name, call, get_settings().args_max_bytes)
    except NotJson:
        bad = non_json(call) or object
        raise ArgumentRefused(
            f"an argument of {name} is a {bad.__name__}, not JSON: {hint(bad)}"
        ) from None
    return kept


# --- starting a workflow -------------------------------------------------------------------


def start(
    sig: Signature, args: Sequence[Any] | None, options: Mapping[str, Any], *, asked: bool = False
) -> Any:
    """Write the canvas's steps and first runs in one transaction, publish after COMMIT,
    and return what Celery returns for it: the last step's handle, or a group's list.
    ``asked``: ``sig`` is a task's call whose ``apply_async`` asked its ``shadow_name``."""
    workflow_id, out, steps = compiled(sig, args, options, asked=asked)
    countdown, eta = options.get("countdown"), options.get("eta")
    # Celery delays a chain's first task, a group's members, a chord's header: the first steps.
    due = (
        None
        if countdown is None and eta is None
        else partial(newjob.due_at, countdown=countdown, eta=eta)
    )
    with get_engine().begin() as conn:
        messages = write(conn, steps, due)
    publish(sig.app, messages)
    nodes = {str(s.job_id): Node(s.job_id, s.module, s.task_name, s.after) for s in steps}
    return handle_of(sig.app, out, nodes, workflow_id)


def compiled(
    sig: Signature,
    args: Sequence[Any] | None,
    options: Mapping[str, Any],
    *,
    into: tuple[uuid.UUID, str] | None = None,
    asked: bool = False,
) -> tuple[uuid.UUID, Output, list[Step]]:
    """The canvas's workflow id, what it answers (a step's job id, or a group's list) and
    its steps; nothing written. A ``task_id`` names the workflow: the same again is the
    same steps. ``into`` (a workflow id, a path unique in it) compiles the canvas as
    steps of that workflow (a step's replacement, lifecycle/workflows/replacement.py)."""
    sig = sig.clone()  # the caller's signature keeps its own callbacks
    for name in ("link", "link_error"):
        if options.get(name):
            sig.options[name] = [*(sig.options.get(name) or ()), *_listed(options[name])]
    unknown = sorted(set(options) - _CANVAS_OPTIONS)
    if unknown:
        raise TypeError(
            f"{type(sig).__name__}.apply_async: jobsapp does not support "
            f"{unknown} on a canvas (it takes {sorted(_CANVAS_OPTIONS)})"
        )
    if into is None and options.get("task_id"):
        sig = _answering_to(sig, str(options["task_id"]))
    workflow_id, path = into or (_workflow_id(options.get("task_id") or _frozen_id(sig)), "0")
    compiler = Compiler(workflow_id, _sender(sig, options), asked=path if asked else None)
    routing = {k: options[k] for k in _ROUTING if options.get(k) is not None}
    out = compiler.node(sig, path, None, tuple(args or ()), (), routing)
    return workflow_id, out, compiler.steps()


def _sender(sig: Signature, options: Mapping[str, Any]) -> newjob.GivenLineage | None:
    """Whom the canvas's first tasks descend from (``newjob.lineage_of``): with no root,
    each is its own, as a call's message is. A chain's own ``parent_id`` is left out, as
    Celery's ``chain.run`` takes it and gives it to no task (from a body, the body is its
    first task's parent all the same: ``send_task`` stamps it)."""
    root = options.get("root_id")
    parent = None if isinstance(sig, _chain) else options.get("parent_id")
    if not (root or parent):
        return newjob.lineage_of(None)
    return newjob.lineage_of((str(root) if root else None, str(parent) if parent else None))


def write(
    conn: Connection, steps: Sequence[Step], due: Callable[[NewJob], NewJob] | None = None
) -> list[PendingMessage]:
    """Write ``steps`` and the runs of the first ones (``due`` when the canvas's countdown or
    eta says), in the caller's transaction; returns their messages, for ``publish`` after
    COMMIT (else the relay publishes them)."""
    workflow.write_steps(conn, steps)
    started = [
        workflow.start(conn, step.row(), _given_at_start(step), actor="producer", due=due)
        for step in steps
        if step.trigger == START
    ]
    return [m for m in started if m is not None]


def publish(app: Any, messages: Sequence[PendingMessage]) -> None:
    """The fast path for the first steps' messages, after their COMMIT."""
    if messages:
        outbox.publish_now(app, [journal.on_local_clock(m, timedelta(0)) for m in messages])


def _given_at_start(step: Step) -> list[Any]:
    """Nothing for a first step; the empty list for a chord of an empty header (Celery
    calls its body with ``[]``)."""
    return [] if step.after is None else [step.after]


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _workflow_id(task_id: Any) -> uuid.UUID:
    """A workflow named by the caller's task id is the same workflow when sent again: the
    id itself when it is a UUID (a group's ``GroupResult`` answers to it, as in Celery)."""
    if not task_id:
        return uuid.uuid4()
    try:
        return uuid.UUID(str(task_id))
    except ValueError:
        return uuid.uuid5(_WORKFLOW_NAMESPACE, str(task_id))


def _answering_to(sig: Signature, task_id: str) -> Signature:
    """``sig`` whose result answers to the ``task_id`` its ``apply_async`` was given, as in
    Celery: a chain's last task, a chord's body (a group's is its workflow's id)."""
    if isinstance(sig, _chain) and sig.tasks:
        *first, last = sig.tasks
        sig.kwargs["tasks"] = [*first, _answering_to(_signature(last, sig), task_id)]
    elif isinstance(sig, chord) and sig.body is not None:
        sig.kwargs["body"] = _answering_to(_signature(sig.body, sig), task_id)
    elif not isinstance(sig, group) and not sig.options.get("task_id"):
        sig = sig.clone()
        sig.options["task_id"] = task_id
    return sig


def _frozen_id(sig: Signature) -> Any:
    """The id a group's ``freeze()`` gave it, which its result must answer to."""
    return sig.options.get("task_id") if isinstance(sig, group) else None


# --- Celery's canvas classes -------------------------------------------------------------------


def _routed(original: Callable[..., Any]) -> Callable[..., Any]:
    def apply_async(self: Signature, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        canvas = _with_body(self, kwargs)
        if self.app.conf.task_always_eager or not is_lifecycle_canvas(canvas):
            return original(self, args, kwargs, **options)
        if kwargs and set(kwargs) != {"body"}:
            raise TypeError(
                f"{type(self).__name__}.apply_async: keyword arguments for a "
                "whole canvas are not supported; give them to its steps"
            )
        wanted = options.pop("add_to_parent", True)
        return trailed(start(canvas, args, options), wanted)

    apply_async.__wrapped__ = original  # type: ignore[attr-defined]
    return apply_async


def _with_body(sig: Signature, kwargs: Any) -> Signature:
    """``chord(header)(body)`` passes the body in apply_async's kwargs."""
    if not isinstance(sig, chord) or not kwargs or kwargs.get("body") is None:
        return sig
    whole = sig.clone()
    whole.kwargs["body"] = kwargs["body"]
    return whole


def install() -> None:
    """Route ``apply_async`` of Celery's chain, group and chord through ``start`` for
    canvases of lifecycle tasks (once per process)."""
    for cls in (_chain, group, chord):
        if not hasattr(cls.apply_async, "__wrapped__"):
            cls.apply_async = _routed(cls.apply_async)  # type: ignore[method-assign]
