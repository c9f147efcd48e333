"""The worker's first look at a message: a body Celery cannot unpack is refused, not fatal.

Celery's default strategy assumes a protocol-2 body ``[args, kwargs, embed]``; a JSON
string or ``null`` there raises inside the consumer and stops the whole worker, which then
meets the same message again at every restart. Checked here, such a message becomes an
``InvalidTaskError``: Celery logs it and rejects it without requeue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Task
from celery.exceptions import InvalidTaskError
from celery.worker.strategy import default


def well_formed(payload: Any) -> bool:
    """A protocol-2 body: ``[args (list), kwargs (dict), embed (dict or null)]``."""
    return (
        isinstance(payload, list | tuple)
        and len(payload) == 3
        and isinstance(payload[0], list | tuple)
        and isinstance(payload[1], dict)
        and (payload[2] is None or isinstance(payload[2], dict))
    )


def checked(task: Task[Any, Any], app: Any, consumer: Any, **kwargs: Any) -> Callable[..., Any]:
    handle = default(task, app, consumer, **kwargs)

    def guarded(message: Any, body: Any, *args: Any, **more: Any) -> Any:
        if not well_formed(message.payload):
            kind = type(message.payload).__name__
            raise InvalidTaskError(f"{task.name}: body is a {kind}, not [args, kwargs, embed]")
        return handle(message, body, *args, **more)

    return guarded


class CheckedTask(Task):  # type: ignore[type-arg]
    """The app's base task: every message passes ``checked`` before a Request is built."""

    Strategy = "jobsapp.lifecycle.strategy:checked"
