"""What a task message must look like before Celery's consumer may touch it.

Celery's consumer trusts the protocol-2 headers: a missing ``id``, a ``task`` that is a list
or a ``timelimit`` that is a string raises inside its event loop, which stops the worker (or,
on Redis, reconnects and meets the same message forever). These checks name the fault
instead, so the guard (``jobsapp.lifecycle.transport.guard``) can reject the message once.

Only the fields Celery reads are checked, each against the type Celery's own producer sends;
unknown headers (trace context, stamps of newer Celery versions) pass. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any, Final

# Protocol 1 put everything in the body; jobsapp and every Celery since 4.0 send protocol 2.
_NO_TASK: Final = "no task header (protocol 1 messages are not accepted)"
_EMBED_LISTS: Final = ("callbacks", "errbacks", "chain")


def _none_or(kind: type | tuple[type, ...]) -> Callable[[Any], bool]:
    return lambda value: value is None or (isinstance(value, kind) and not isinstance(value, bool))


def _timestamp(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, str):
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _limit(value: Any) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return value is None or (number and value >= 0)


def _time_limits(value: Any) -> bool:
    """``[soft, hard]``, each seconds or null; Celery unpacks it into two names."""
    if value is None:
        return True
    return isinstance(value, list | tuple) and len(value) == 2 and all(map(_limit, value))


def _strings(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def _count(value: Any) -> bool:  # bool is an int to Python, not to the JSON producer
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


_OPTIONAL: Final[Mapping[str, tuple[Callable[[Any], bool], str]]] = {
    "shadow": (_none_or(str), "a string"),
    "root_id": (_none_or(str), "a string"),
    "parent_id": (_none_or(str), "a string"),
    "group": (_none_or(str), "a string"),
    "group_index": (_count, "a count"),
    "argsrepr": (_none_or(str), "a string"),
    "kwargsrepr": (_none_or(str), "a string"),
    "origin": (_none_or(str), "a string"),
    "eta": (_timestamp, "an ISO 8601 time"),
    "expires": (_timestamp, "an ISO 8601 time"),
    "timelimit": (_time_limits, "[soft, hard] seconds"),
    "retries": (_count, "a count"),
    "replaced_task_nesting": (_count, "a count"),
    "ignore_result": (lambda value: value is None or isinstance(value, bool), "a boolean"),
    "stamped_headers": (_strings, "a list of strings"),
    "stamps": (_none_or(dict), "a mapping"),
}


def header_fault(headers: Any) -> str | None:
    """Why Celery must not see a message with these headers, or None when it may. Whether
    a worker here registered the task is Celery's to find (its consumer's
    ``on_unknown_task``, which the guard extends): its handler reads only the ``task`` and
    ``id`` headers checked here."""
    if not isinstance(headers, Mapping):
        return f"headers are {_kind(headers)}, not a mapping"
    return _identity_fault(headers) or next(_optional_faults(headers), None)


def _identity_fault(headers: Mapping[str, Any]) -> str | None:
    task, task_id = headers.get("task"), headers.get("id")
    if task is None:
        return _NO_TASK
    if not isinstance(task, str):
        return f"task header is {_kind(task)}, not a string"
    if "id" not in headers:
        return "no id header"
    if not isinstance(task_id, str) or not task_id:
        return f"id header is {_kind(task_id)}, not a task id"
    return None


def _optional_faults(headers: Mapping[str, Any]) -> Iterator[str]:
    for name, (valid, expected) in _OPTIONAL.items():
        if name in headers and not valid(headers[name]):
            yield f"{name} header is {_kind(headers[name])}, not {expected}"


def body_fault(payload: Any) -> str | None:
    """Why a decoded protocol-2 body ``[args, kwargs, embed]`` is unusable, or None."""
    if not (isinstance(payload, list | tuple) and len(payload) == 3):
        return f"body is {_kind(payload)}, not [args, kwargs, embed]"
    args, kwargs, embed = payload
    if not isinstance(args, list | tuple):
        return f"args are {_kind(args)}, not a list"
    if not isinstance(kwargs, Mapping):
        return f"kwargs are {_kind(kwargs)}, not a mapping"
    if embed is not None and not isinstance(embed, Mapping):
        return f"embed is {_kind(embed)}, not a mapping"
    return next(_embed_faults(embed or {}), None)


def _embed_faults(embed: Mapping[str, Any]) -> Iterator[str]:
    for name in _EMBED_LISTS:
        if not isinstance(embed.get(name), list | tuple | None):
            yield f"embed {name} is {_kind(embed[name])}, not a list"
    if not isinstance(embed.get("chord"), Mapping | None):
        yield f"embed chord is {_kind(embed['chord'])}, not a mapping"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if value == "":
        return "an empty string"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
