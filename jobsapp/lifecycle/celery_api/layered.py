"""The journal over a deployment's own result backend: plain tasks keep theirs.

A team's Celery setup names a result backend (``result_backend = "redis://..."`` in its
settings module, or ``CELERY_RESULT_BACKEND`` in its environment, which Celery reads
before any setting). Taken as the app's backend it replaced the journal, and every reader
of a lifecycle job's result through the app (``AsyncResult(id, app=app)``,
``GroupResult.restore``, ``celery result``) waited on a store the job never writes to.

``jobsapp.celery_app`` makes ``over_deployment`` Celery's backend class (``RESULTS`` there:
``app.backend_cls``, which Celery prefers to the setting). It builds the deployment's
backend as Celery would, under the journal: an id the journal knows (a lifecycle job's, a
workflow's group) is answered from the journal; every other read, every write (a plain
task's result, its revoke, its chord) and the rest of Celery's backend API (native joins,
chords, expiry) are the deployment backend's own. Lifecycle tasks never write here: their
backend is the journal alone (``backend.for_app``). With no backend named (jobsapp's
shipped setting), the app's backend is the journal alone, as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

from celery import Celery
from celery.app.backends import by_url

from jobsapp.db import get_engine
from jobsapp.lifecycle.celery_api.backend import NAME, JournalBackend, find
from jobsapp.lifecycle.journal.schema_checked import SchemaChecked
from jobsapp.lifecycle.rules.message import job_id_of_task


def over_deployment(app: Celery, url: str | None = None) -> Any:
    """Celery's backend for ``app``: the journal, over the backend its settings name."""
    del url  # Celery's, from backend_cls: none
    named = app.conf.result_backend
    if not named or named == NAME:
        return JournalBackend(app)
    found: Any = by_url(named, app.loader)  # (class, url); celery-types says a class
    inner, inner_url = found
    return _layered(inner)(app=app, url=inner_url)


@cache
def _layered(inner: type) -> type:
    return type(f"Journal{inner.__name__}", (JournalOver, inner), {})


def _known(task_id: Any) -> bool:
    """Whether a run (or a workflow step's stand-in) of the journal answers ``task_id``."""
    with SchemaChecked(), get_engine().connect() as conn:
        return find(conn, job_id_of_task(str(task_id)))[1] is not None


def _first_known(result: Any) -> bool:
    """Whether a group's results are lifecycle jobs: a canvas never mixes them with plain
    tasks (``workflows.canvas`` refuses the call)."""
    results: list[Any] = list(getattr(result, "results", None) or ())
    return bool(results) and _known(results[0].id)


class JournalOver:
    """The journal first, then the deployment's backend: the class after this one, whose
    methods (sync or async, Redis's pub/sub included) stay its own for every plain id."""

    app: Celery

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.journal = JournalBackend(self.app)

    def as_uri(self, include_password: bool = False) -> str:
        return f"jobsapp+{super().as_uri(include_password)}"  # type: ignore[misc]

    # Celery's public entry points, not the private ones under them: a backend may replace
    # those (rpc:// answers get_task_meta from its reply queue, refuses restore_group).
    def get_task_meta(self, task_id: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if _known(task_id):
            return self.journal.get_task_meta(task_id)
        theirs: dict[str, Any] = super().get_task_meta(task_id, *args, **kwargs)  # type: ignore[misc]
        return theirs

    def add_pending_result(self, result: Any, *args: Any, **kwargs: Any) -> Any:
        # An async backend (Redis's) would subscribe to a job that never publishes there.
        if _known(result.id):
            return result
        return super().add_pending_result(result, *args, **kwargs)  # type: ignore[misc]

    def wait_for_pending(self, result: Any, *args: Any, **kwargs: Any) -> Any:
        if _known(result.id):
            return self.journal.wait_for_pending(result, *args, **kwargs)
        return super().wait_for_pending(result, *args, **kwargs)  # type: ignore[misc]

    def get_many(self, task_ids: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        task_ids = list(task_ids)
        if task_ids and _known(task_ids[0]):
            return self.journal.get_many(task_ids, *args, **kwargs)
        theirs: Iterator[Any] = super().get_many(task_ids, *args, **kwargs)  # type: ignore[misc]
        return theirs

    def iter_native(self, result: Any, **kwargs: Any) -> Iterator[Any]:
        if _first_known(result):
            native: Any = self.journal.iter_native  # a generator; celery-types says None
            ours: Iterator[Any] = native(result, **kwargs)
            return ours
        theirs: Iterator[Any] = super().iter_native(result, **kwargs)  # type: ignore[misc]
        return theirs

    def forget(self, task_id: str) -> None:
        if _known(task_id):
            self.journal.forget(task_id)
        else:
            super().forget(task_id)  # type: ignore[misc]

    def save_group(self, group_id: str, result: Any) -> Any:
        if _first_known(result):
            return result  # the group is its workflow, already in the journal
        return super().save_group(group_id, result)  # type: ignore[misc]

    def restore_group(self, group_id: str, *args: Any, **kwargs: Any) -> Any:
        ours = self.journal.restore_group(group_id)
        return ours or super().restore_group(group_id, *args, **kwargs)  # type: ignore[misc]

    def delete_group(self, group_id: str) -> None:
        if self.journal.restore_group(group_id) is None:  # a workflow stays in the journal
            super().delete_group(group_id)  # type: ignore[misc]
