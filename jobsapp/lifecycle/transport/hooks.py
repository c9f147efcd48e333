"""Publish filters: the one way a feature enters the producer's fast path.

``publish_now`` hands its messages to each filter registered on the app, in order; a
filter returns those it lets the fast path publish now (the rest stay pending in the
outbox for the relay). A feature registers its filter when the app is set up
(flow control's pause filter: by ``jobsapp.celery_app`` on the deployment's app, and by
``LifecycleTask.on_bound`` on any app a lifecycle task joins), never at import; an app with
none pays one dictionary lookup per publish and enters no feature's code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from celery import Celery

from jobsapp.lifecycle.journal import PendingMessage

PublishFilter = Callable[[Celery, Sequence[PendingMessage]], Sequence[PendingMessage]]

# On the app itself (as backend.for_app keeps its backend): two apps in one process, a
# deployment's and a team's plain one, keep their own filters.
_KEY = "_jobsapp_publish_filters"


def add_publish_filter(app: Celery, keep: PublishFilter) -> None:
    """Register ``keep`` on ``app``'s fast path (once: a second call changes nothing)."""
    filters: list[PublishFilter] = app.__dict__.setdefault(_KEY, [])
    if keep not in filters:
        filters.append(keep)


def publish_filters(app: Celery) -> Sequence[PublishFilter]:
    """The filters registered on ``app``, in the order they run; empty for a plain app."""
    filters: Sequence[PublishFilter] = app.__dict__.get(_KEY, ())
    return filters
