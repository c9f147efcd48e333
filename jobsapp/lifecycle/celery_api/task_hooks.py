"""A team's own Task class under a lifecycle task: its base, its hooks and its ``__call__``.

Celery teams put what every task shares in a base class: ``on_failure`` reporting to their
error tracker, ``on_success`` and ``after_return`` logging, ``on_retry`` counting, and a
``__call__`` that runs the body inside an application context (Flask's documented
``task_cls``). ``lifecycle_task(app, base=TheirBase)`` and an app whose ``task_cls`` is
theirs keep that class: LifecycleTask is put behind it (``lifecycle_base``), so their
methods come first and reach the journal's through ``super()``; the delivery stays the
journal's, with their ``__call__`` around the body.

Celery's tracer calls the hooks with the delivered message's task id and arguments, which
for a lifecycle task are an attempt's id and its envelope. A hook here is given what
Celery gives it for a plain task instead: the job's id (the id the caller holds,
``AsyncResult.id``), the body's own arguments, the exception the body raised (for
``on_retry``, what the retry was asked with, as Celery's ``reason.exc``), with
``self.request`` the body's view of the call. ``before_start``, which Celery's tracer calls
before the delivery has claimed the attempt, is called by the delivery instead, once the
run is the body's: a refused duplicate never starts it, as it never starts the body. A task
without hooks or a ``__call__`` of a team's pays two class attribute reads a delivery.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from celery import Celery, Task
from celery.utils.imports import symbol_by_name

from jobsapp.lifecycle.rules.errors import RetryRequested

# Celery's Task hooks that are given the call (its id, arguments) after the body ran.
HOOKS = ("on_success", "on_failure", "on_retry", "after_return")
# Where a delivery keeps the job's view of the call on Celery's request, for the hooks.
VIEW = "jobsapp_call"
# Set on the body's request when a team's __call__ runs around it: that __call__'s
# super().__call__() runs the body, not a second delivery.
IN_BODY = "jobsapp_in_body"
_WRAPPED = "__jobsapp_hook__"


@dataclass
class CallView:
    """The call as the body saw it, and how its attempt ended."""

    job_id: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    retries: int
    root_id: str
    error: BaseException | None = None

    def retry_reason(self) -> BaseException | None:
        """What ``on_retry`` is given: the retry's exception, as Celery's ``reason.exc``."""
        if isinstance(self.error, RetryRequested):
            return self.error.cause
        return self.error

    def hook_arguments(self, name: str, given: tuple[Any, ...]) -> tuple[Any, ...]:
        """``given`` (Celery's positional arguments to hook ``name``) with the job's id, the
        body's arguments and the body's exception in their places."""
        own = (self.job_id, list(self.args), dict(self.kwargs))
        if name == "on_success":  # (retval, task_id, args, kwargs)
            return (given[0], *own)
        if name == "after_return":  # (status, retval, task_id, args, kwargs, einfo)
            status, retval = given[0], given[1]
            if status == "FAILURE" and self.error is not None:
                retval = self.error
            return (status, retval, *own, *given[5:])
        # on_failure, on_retry: (exc, task_id, args, kwargs, einfo)
        exc = self.retry_reason() if name == "on_retry" else (self.error or given[0])
        return (exc, *own, *given[4:])


def _hook_of_the_job(name: str, hook: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(hook)
    def of_the_job(self: Any, *given: Any, **named: Any) -> Any:
        view = self.request.get(VIEW)
        if view is None or named:  # a plain Celery call, or one this module did not make
            return hook(self, *given, **named)
        # The hook's own super() calls and reads see the body's request, not the view again.
        self.push_request(
            id=view.job_id,
            args=list(view.args),
            kwargs=dict(view.kwargs),
            retries=view.retries,
            root_id=view.root_id,
            **{VIEW: None},
        )
        try:
            return hook(self, *view.hook_arguments(name, given))
        finally:
            self.pop_request()

    setattr(of_the_job, _WRAPPED, True)
    return of_the_job


def _started_by_the_delivery(hook: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(hook)
    def before_start(self: Any, *given: Any, **named: Any) -> Any:
        view = self.request.get(VIEW)
        if view is not None:  # the delivery's call, the body's request current
            return hook(self, view.job_id, list(view.args), dict(view.kwargs))
        if self.request.called_directly:  # a call of the team's own, outside a worker
            return hook(self, *given, **named)
        return None  # Celery's tracer, before the claim: the delivery calls it after

    setattr(before_start, _WRAPPED, True)
    return before_start


def wrap_hooks(cls: type) -> bool:
    """Give each hook ``cls`` has of its own (or from a team's base) the job's view; whether
    it has any."""
    hooked = False
    for name in (*HOOKS, "before_start"):
        hook = getattr(cls, name)
        if hook is getattr(Task, name):
            continue
        hooked = True
        if not getattr(hook, _WRAPPED, False):
            wrapped = (
                _hook_of_the_job(name, hook) if name in HOOKS else _started_by_the_delivery(hook)
            )
            setattr(cls, name, wrapped)
    return hooked


def body_call(cls: type, lifecycle: type) -> Callable[..., Any] | None:
    """A team's own ``__call__`` among ``cls``'s classes (a base that is not a ``lifecycle``
    class: the one that runs the body inside an app context), which then runs the body
    inside the attempt; None: ``run`` is called."""
    for klass in cls.__mro__:
        if klass is Task:
            return None
        found = klass.__dict__.get("__call__")
        if found is not None and not issubclass(klass, lifecycle):
            return found  # type: ignore[no-any-return]
    return None


def lifecycle_base(app: Celery, base: type | None, lifecycle: type) -> type:
    """The class ``lifecycle_task`` declares on: ``base`` (else the app's ``task_cls``, as
    ``@app.task`` does) with ``lifecycle`` behind it, or ``lifecycle`` for Celery's own."""
    if base is None or base is app.Task:  # app.Task: the app's task_cls, bound to it
        named = app.task_cls or Task
        base = named if isinstance(named, type) else symbol_by_name(named)
    if issubclass(base, lifecycle):
        return base
    if base is Task:
        return lifecycle
    return _mixed(lifecycle, base)


@functools.cache
def _mixed(lifecycle: type, base: type) -> type:
    """``base`` in front of ``lifecycle``: the team's methods first, their ``super()``
    calls reaching the journal's (an ``apply_async`` that adds a header, a ``retry`` that
    logs). Only what a delivery needs stays the journal's: Celery calls ``__call__`` with
    the message (the team's runs around the body, ``body_call``), and the worker builds
    ``lifecycle``'s ``Request``; ``throws`` holds both classes' expected errors; the
    journal's registrations follow a team's own ``on_bound``."""
    namespace: dict[str, Any] = {
        "__module__": base.__module__,
        "__qualname__": f"Lifecycle{base.__qualname__}",
        "__call__": lifecycle.__call__,
        "Request": _request_of(lifecycle, base),
        "throws": tuple(dict.fromkeys((*lifecycle.throws, *base.throws))),  # type: ignore[attr-defined]
    }
    team_on_bound = base.on_bound.__func__  # type: ignore[attr-defined]
    if team_on_bound is not Task.on_bound.__func__:  # type: ignore[attr-defined]
        namespace["on_bound"] = classmethod(_on_bound_then_joined(lifecycle, team_on_bound))
    return type(f"Lifecycle{base.__name__}", (base, lifecycle), namespace)


def _on_bound_then_joined(
    lifecycle: type, team_on_bound: Callable[[type, Celery], None]
) -> Callable[[type, Celery], None]:
    def on_bound(cls: type, app: Celery) -> None:
        team_on_bound(cls, app)  # its super() reaches the journal's, if it calls one
        lifecycle.joined(app)  # type: ignore[attr-defined]

    return on_bound


def _request_of(lifecycle: type, base: type) -> Any:
    """``lifecycle``'s worker request, or the team's own if it extends it; a team request
    that does not is refused where the task is declared."""
    own = base.Request  # type: ignore[attr-defined]
    if own == Task.Request:
        return lifecycle.Request  # type: ignore[attr-defined]
    needed = symbol_by_name(lifecycle.Request)  # type: ignore[attr-defined]
    found = symbol_by_name(own) if isinstance(own, str) else own
    if not (isinstance(found, type) and issubclass(found, needed)):
        raise TypeError(
            f"{base.__qualname__}.Request must extend {needed.__module__}.{needed.__name__} "
            "for a lifecycle task (the worker records time limits and terminations there)"
        )
    return own
