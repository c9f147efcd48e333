"""The ``task`` and ``queue`` label values /metrics may export: bounded by code, not data.

A run table's ``task_name`` and ``queue`` are whatever producers wrote: a renamed task, a
queue per tenant or a typo would each become a Prometheus series that lives as long as
the retention keeps its rows. So a label says a task's name only if the app registers it
as a lifecycle task, and a queue's only if the app's configuration names it (the default
queue, ``task_queues``, a registered task's ``queue`` attribute or route); every other
value is folded into ``other``. The series are then at most (registered tasks + 1) x
(configured queues + 1) per module and state, known before the first job runs, which is
also what lets every counter start with a zero series.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from celery import Celery

from jobsapp.lifecycle.task import LifecycleTask

OTHER = "other"


@dataclass(frozen=True)
class Labels:
    # Registered lifecycle task -> (its run table's module, the queue it goes to by default).
    tasks: Mapping[str, tuple[str, str]]
    queues: frozenset[str]
    default_queue: str

    def task(self, name: str) -> str:
        return name if name in self.tasks else OTHER

    def queue(self, task: str, queue: str | None) -> str:
        """``queue`` as a label; None (the producer chose none) is the task's own route."""
        if queue is None:
            return self.tasks[task][1] if task in self.tasks else self.default_queue
        return queue if queue in self.queues else OTHER

    def registered(self) -> list[tuple[str, str, str]]:
        """``(module, task, queue)`` of every registered task: the series that start at 0."""
        return sorted((module, task, queue) for task, (module, queue) in self.tasks.items())


def of_app(app: Celery) -> Labels:
    # The web process knows the tasks only once the worker's imports are loaded.
    app.loader.import_default_modules()
    default = str(app.conf.task_default_queue)
    tasks = {
        name: (task.run_table.module, _route(app, task))
        for name, task in app.tasks.items()
        if isinstance(task, LifecycleTask)
    }
    configured = {q.name for q in app.conf.task_queues or ()}
    return Labels(
        tasks, frozenset({default, *configured, *(q for _, q in tasks.values())}), default
    )


def _route(app: Celery, task: LifecycleTask) -> str:
    own = getattr(task, "queue", None)
    if own:
        return str(own)
    routed = app.amqp.router.route({}, task.name)["queue"]
    return str(getattr(routed, "name", routed))
