"""Celery's new-style errback, ``(request, exc, traceback)``, on lifecycle tasks.

Celery calls an errback whose body takes more than one argument in the failing worker, inline,
with the failed task's request, its exception and its traceback (``BaseBackend.
_call_task_errbacks``); a worker that dies there loses the call. In a lifecycle canvas an
errback is a step of the workflow, started in the failure's own transaction, so it runs once
whatever dies. Its run cannot store a request or an exception as arguments, so the compiler
marks a new-style errback's step (``MARK`` among its keyword arguments, next to the failed
step's id the journal gives every errback first) and the attempt turns that id back into what
Celery passes, read from the failed run: the request it ran with, its exception rebuilt as
``get()`` rebuilds it, and its stored traceback.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from functools import partial
from typing import Any

from celery import Celery
from celery.app.task import Context
from celery.utils.functional import arity_greater

from jobsapp.db import get_engine
from jobsapp.lifecycle.celery_api.backend import find, for_app
from jobsapp.lifecycle.rules.results import decoded

MARK = "__jobsapp_errback_request__"


def is_new_style(task: Any) -> bool:
    """Celery's own test: a task declared with ``@app.task`` whose body takes more than one
    argument is called ``(request, exc, traceback)``."""
    header = getattr(task, "__header__", None)
    return header is not None and not isinstance(header, partial) and bool(arity_greater(header, 1))


def arguments(
    app: Celery, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A marked errback's call: the failed step's id (first of ``args``) becomes the failed
    task's request, exception and traceback; the errback's own arguments follow."""
    failed, *own = args
    with get_engine().connect() as conn:
        spec, row = find(conn, uuid.UUID(str(failed)))
        meta = for_app(app).meta_of(conn, str(failed), spec, row)
    params = (
        decoded(row.columns[spec.params_column] or {})
        if spec and row and spec.params_column
        else {}
    )
    request = Context(
        id=str(failed),
        task=meta.get("name"),
        args=list(params.get("args", ())),
        kwargs=dict(params.get("kwargs", {})),
        retries=meta.get("retries", 0),
        hostname=meta.get("worker"),
    )
    rest = {k: v for k, v in kwargs.items() if k != MARK}
    return (request, meta["result"], meta["traceback"], *own), rest


def given_the_job(app: Celery, errbacks: list[Any], job: str) -> list[Any]:
    """A plain call's errbacks for a later attempt: Celery gives an old-style errback the
    failed task's id, which there is the attempt's own (a Celery retry keeps its task's),
    and ``AsyncResult`` of it names no job; bound to the job's id instead, the id its
    caller holds. A new-style one, an immutable one, and one of a task this worker does not
    know are left as they are."""
    return [_bound(app, errback, job) for errback in errbacks]


def _bound(app: Celery, errback: Any, job: str) -> Any:
    sig = app.signature(errback)
    task = app.tasks.get(sig.task or "")
    if sig.immutable or task is None or is_new_style(task):
        return errback
    return sig.clone(args=(job,)).set(immutable=True)
