"""The bodies of the conformance idioms, declared the same on a bare Celery app
(``bare_app``) and as lifecycle tasks (``lifecycle_tasks``): ``@app.task(name=..., **OPTIONS
[name])(BODIES[name])`` on each.

The bodies run in prefork children of real workers, so what a program and a body share goes
through Redis (``CONFORMANCE_REDIS_URL``): a body counts its runs, says it started, and waits
for a release the program gives.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import redis
from celery import Task
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import task_postrun, task_prerun

REDIS_URL = "CONFORMANCE_REDIS_URL"
HOLD = 20.0  # the longest a body waits for its release


@cache
def store() -> redis.Redis:
    return redis.Redis.from_url(os.environ[REDIS_URL], decode_responses=True)


def count(token: str) -> int:
    """Count one run of a body under ``token``; the count so far."""
    return int(store().incr(f"conformance:runs:{token}"))


def runs(token: str) -> int:
    return int(store().get(f"conformance:runs:{token}") or 0)


def release(token: str) -> None:
    store().set(f"conformance:release:{token}", 1, ex=60)


def _held(token: str) -> None:
    """Say the body started, then wait (at most HOLD) for the program's release."""
    count(f"started:{token}")
    deadline = time.monotonic() + HOLD
    while not store().get(f"conformance:release:{token}") and time.monotonic() < deadline:
        time.sleep(0.05)


def sibling(task: Any, short: str) -> Any:
    """The task ``short`` of the app ``task`` belongs to (``bare.add`` beside ``bare.x``)."""
    prefix = task.name.rpartition(".")[0]
    return task.app.tasks[f"{prefix}.{short}"]


def _add(x: int, y: int) -> int:
    return x + y


def _tsum(nums: list[int]) -> int:
    return sum(nums)


def _identity(x: Any) -> Any:
    return x


def _kinds(values: list[Any]) -> list[str]:
    """The types the body received (kombu's JSON gives some back as themselves)."""
    return [type(value).__name__ for value in values]


def _boom(token: str) -> None:
    raise ValueError(f"boom {token}")


def _request_seen(self: Any, x: int, k: int = 0) -> list[Any]:
    request = self.request
    return [request.id, list(request.args), dict(request.kwargs), request.retries]


def _progress(self: Any, token: str) -> str:
    self.update_state(state="PROGRESS", meta={"step": 1, "token": token})
    _held(token)
    return "done"


# What an error tracker or a tracer hangs on Celery's task signals: the task id each names.
SIGNALLED = "conformance:signalled:{}:{}"


@task_prerun.connect
def _heard_prerun(task_id: str = "", **_: Any) -> None:
    if REDIS_URL in os.environ:  # a conformance worker's, not another test's in pytest
        store().set(SIGNALLED.format("prerun", task_id), 1, ex=120)


@task_postrun.connect
def _heard_postrun(task_id: str = "", state: str = "", **_: Any) -> None:
    if REDIS_URL in os.environ:
        store().set(SIGNALLED.format("postrun", task_id), state, ex=120)


def signalled(signal: str, task_id: str) -> str | None:
    """What the worker's receiver of ``signal`` heard for ``task_id`` (``1``, or a state)."""
    return store().get(SIGNALLED.format(signal, task_id))


def _held_body(token: str) -> str:
    _held(token)
    return "released"


def _missing(token: str) -> None:
    raise KeyError(f"missing {token}")


def _retried_out(self: Any, token: str) -> None:
    raise self.retry(countdown=0, max_retries=1)


def _retry_with_exc(self: Any, token: str) -> None:
    raise self.retry(exc=KeyError(f"gone {token}"), countdown=0, max_retries=0)


def _flaky(self: Any, token: str) -> int:
    """Succeeds at its second run, after asking for a retry at its first."""
    if count(token) == 1:
        raise self.retry(countdown=0)
    return int(self.request.retries)


def _flaky_auto(token: str) -> int:
    """Raises ConnectionError (listed in ``autoretry_for``) at its first run."""
    seen = count(token)
    if seen == 1:
        raise ConnectionError(f"down {token}")
    return seen


def _thrown(token: str) -> None:
    raise KeyError(f"expected {token}")


def _hang(token: str) -> str:
    count(f"started:{token}")
    time.sleep(10)
    return "woke"


def _soft(token: str) -> str:
    try:
        time.sleep(10)
    except SoftTimeLimitExceeded:
        return f"soft {token}"
    return "woke"


def _soft_uncaught(token: str) -> str:
    time.sleep(10)
    return "woke"


def _on_error(request: Any, exc: BaseException, traceback: Any) -> None:
    """Celery's new-style errback: what it was given, where the program can read it."""
    store().set(
        f"conformance:errback:{request.id}",
        f"{request.task}|{type(exc).__name__}: {exc}|{isinstance(traceback, str)}",
        ex=60,
    )


def _replaced(self: Any, x: int) -> None:
    return self.replace(sibling(self, "add").s(x, 1))  # type: ignore[no-any-return]


def _get_inside(self: Any) -> str:
    try:
        sibling(self, "add").delay(1, 1).get(timeout=5)
    except RuntimeError as refused:
        return f"RuntimeError: {str(refused)[:27]}"
    return "waited"


def _opaque() -> object:
    return object()


def heard(token: str) -> list[str]:
    """What a team's hooks heard of the runs of ``token``, in order."""
    return list(store().lrange(f"conformance:heard:{token}", 0, -1))


def _hear(self: Any, task_id: str, args: Any, what: str) -> None:
    """Keep what a hook heard, under the token its call was given."""
    token = args[0]
    seen = f"{what} {task_id} {list(args)} {task_id == self.request.id}"
    store().rpush(f"conformance:heard:{token}", seen)
    store().expire(f"conformance:heard:{token}", 60)


class Hooked(Task):  # type: ignore[type-arg]
    """A team's base class: its hooks report what each call did (an error tracker, logs)."""

    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        del kwargs
        _hear(self, task_id, args, f"on_success {retval}")

    def on_failure(self, exc: Exception, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        del kwargs, einfo  # Celery's signature
        _hear(self, task_id, args, f"on_failure {exc!r}")

    def on_retry(self, exc: Exception, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        del kwargs, einfo
        _hear(self, task_id, args, f"on_retry {exc!r}")

    def after_return(
        self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        del kwargs, einfo
        _hear(self, task_id, args, f"after_return {status} {retval!r}")


class StartHooked(Task):  # type: ignore[type-arg]
    """A team's base class that opens each run's context (a log's, a tracer's) before it."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        _hear(self, task_id, args, f"before_start {kwargs} retries={self.request.retries}")


def _hooked(self: Any, token: str, fail: bool) -> str:
    """Asks for a retry at its first run; then fails or succeeds, as told."""
    if count(token) == 1:
        raise self.retry(countdown=0)
    if fail:
        raise ValueError(f"failed {token}")
    return "ok"


def _tenant(self: Any, token: str) -> list[Any]:
    """What a body reads of its call's own headers, at its first run and its retry."""
    request = self.request
    headers = request.headers if isinstance(request.headers, dict) else {}
    if count(token) == 1:
        raise self.retry(countdown=0)
    return [getattr(request, "tenant", None), headers.get("tenant"), request.retries]


def _queue_seen(self: Any, x: int) -> list[Any]:
    """The body's argument, and which of the test's two queues delivered it."""
    routing_key = (self.request.delivery_info or {}).get("routing_key") or ""
    return [x, "second" if routing_key.endswith("-second") else "first"]


def _get_allowed(self: Any) -> Any:
    from celery.result import allow_join_result

    with allow_join_result():
        return sibling(self, "add").delay(2, 2).get(timeout=10, disable_sync_subtasks=False)


def _ignored(token: str) -> None:
    from celery.exceptions import Ignore

    count(token)
    raise Ignore()


def _rejected(token: str) -> None:
    from celery.exceptions import Reject

    count(token)
    raise Reject("no thanks", requeue=False)


def _whereabouts(self: Any) -> list[Any]:
    """What a body logs of where it runs."""
    request = self.request
    return [
        "@" in (request.hostname or ""),
        request.is_eager,
        request.called_directly,
        self.name == request.task,
    ]


def _lineage(self: Any, token: str | None = None) -> list[Any]:
    """The ids a body logs to tie itself to its caller; asks for one retry first if given a
    ``token``."""
    if token is not None and count(token) == 1:
        raise self.retry(countdown=0)
    request = self.request
    return [request.id, request.root_id, request.parent_id, request.retries]


def _step_lineage(self: Any, *_: Any) -> list[Any]:
    """What a canvas step logs of where it sits: its id, root, parent and group."""
    request = self.request
    return [request.id, request.root_id, request.parent_id, request.group]


def _sends_chain(self: Any) -> list[str]:
    """Sends a chain of two steps from its body: their ids."""
    from celery import chain

    step = sibling(self, "step_lineage")
    sent = chain(step.s(), step.s()).delay()
    return [str(sent.parent.id), str(sent.id)]


def _sends_group(self: Any) -> list[Any]:
    """Sends a group of two from its body: its id and its members' ids."""
    from celery import group

    add = sibling(self, "add")
    sent = group(add.s(1, 1), add.s(2, 2)).delay()
    return [str(sent.id), [str(r.id) for r in sent.results]]


def _sends_chord(self: Any) -> list[Any]:
    """Sends a chord of two from its body: its header's id and its members' ids."""
    from celery import chord

    add, tsum = sibling(self, "add"), sibling(self, "tsum")
    header = chord([add.s(1, 1), add.s(2, 2)], tsum.s()).delay().parent
    return [str(header.id), [str(r.id) for r in header.results]]


def _calls_two(self: Any) -> list[str]:
    """Calls ``add`` twice from its body (``.delay()``, ``apply_async``): their ids."""
    add = sibling(self, "add")
    return [add.delay(1, 1).id, add.apply_async((2, 2)).id]


def _calls_one_not_a_child(self: Any) -> list[str]:
    """Calls ``add`` twice, the first with ``add_to_parent=False``: their ids."""
    add = sibling(self, "add")
    return [add.apply_async((1, 1), add_to_parent=False).id, add.delay(2, 2).id]


def _calls_then_retries(self: Any, token: str) -> list[str]:
    """Calls ``add`` at each attempt; the first then retries: the calls' ids, first to last."""
    made = store().rpush(f"conformance:calls:{token}", sibling(self, "add").delay(1, 1).id)
    if made == 1:
        raise self.retry(countdown=0.2)
    return list(store().lrange(f"conformance:calls:{token}", 0, -1))


def _sends_with_links(self: Any) -> list[str]:
    """Sends ``add`` by name from its body, once with one callback, once with two (each a
    ``step_lineage``): the ids of the calls it made."""
    add, seen = sibling(self, "add"), sibling(self, "step_lineage")
    one = self.app.send_task(add.name, (2, 3), link=seen.s())
    two = self.app.send_task(add.name, (1, 1), link=[seen.s(), seen.s()])
    return [str(one.id), str(two.id)]


def _calls_in_a_transaction(self: Any) -> list[str]:
    """Calls ``add`` from its body as the team's code does it: a lifecycle call joins a
    journal transaction (``connection=``: the relay publishes it), a bare one is sent."""
    add = sibling(self, "add")
    if not self.name.startswith("conf."):
        return [add.delay(2, 3).id]
    from jobsapp.db import get_engine

    with get_engine().begin() as conn:
        return [add.apply_async((2, 3), connection=conn).id]


def _call_fields(self: Any) -> list[Any]:
    """What a body reads of its call besides its arguments: its limits, when it was due and
    expires (seconds from now), where it was routed, whether its result is kept."""
    from datetime import UTC, datetime

    r = self.request
    info = r.delivery_info or {}
    expires = None
    if r.expires is not None:
        seconds = (datetime.fromisoformat(r.expires) - datetime.now(UTC)).total_seconds()
        expires = round(seconds / 10) * 10
    return [
        r.correlation_id == r.id,
        r.timelimit,
        r.eta is not None,
        expires,
        info.get("routing_key") == self.app.conf.task_default_queue,
        r.ignore_result,
    ]


def _count_run(token: str) -> int:
    """Counts its run under ``token``."""
    return count(token)


def _ends_chain(self: Any, value: Any) -> Any:
    """Ends the chain it is a step of (Celery's way): the chain's later steps never run."""
    self.request.chain = None
    return value


def _sends_lineage(self: Any) -> str:
    """Sends a task from its body: the id of the call it made."""
    return str(sibling(self, "lineage").delay().id)


# --- probes: idioms where jobsapp answered otherwise than Celery ------------------------


class WrappedError(Exception):
    """A team's exception whose ``args`` are not its ``__init__``'s (it formats its message)."""

    def __init__(self, field: str, value: int) -> None:
        super().__init__(f"{field} is {value}")
        self.field = field


class Opaque:
    """An object a team's exception carries (a response, a record): no JSON for it."""

    def __repr__(self) -> str:
        return "<Opaque>"


def _wrapped(token: str) -> None:
    raise WrappedError(f"size {token}", 3)


def _boom_carrying(kind: str) -> None:
    """Raises a ValueError carrying a dict, or an object JSON cannot carry."""
    if kind == "dict":
        raise ValueError({"field": "email", "code": 7})
    raise ValueError("bad response", Opaque())


def _big_result(size: int) -> str:
    return "x" * size


def _length(text: str) -> int:
    return len(text)


BODIES: Mapping[str, Callable[..., Any]] = {
    "add": _add,
    "tsum": _tsum,
    "identity": _identity,
    "kinds": _kinds,
    "boom": _boom,
    "request_seen": _request_seen,
    "progress": _progress,
    "held": _held_body,
    "held_once": _held_body,
    "missing": _missing,
    "retried_out": _retried_out,
    "retry_with_exc": _retry_with_exc,
    "flaky": _flaky,
    "flaky_auto": _flaky_auto,
    "thrown": _thrown,
    "hang": _hang,
    "soft": _soft,
    "soft_uncaught": _soft_uncaught,
    "on_error": _on_error,
    "replaced": _replaced,
    "get_inside": _get_inside,
    "opaque": _opaque,
    "hooked": _hooked,
    "tenant": _tenant,
    "queue_seen": _queue_seen,
    "quiet": _add,
    "short_lived": _add,
    "get_allowed": _get_allowed,
    "ignored": _ignored,
    "rejected": _rejected,
    "whereabouts": _whereabouts,
    "lineage": _lineage,
    "sends_lineage": _sends_lineage,
    "step_lineage": _step_lineage,
    "sends_chain": _sends_chain,
    "sends_group": _sends_group,
    "sends_chord": _sends_chord,
    "calls_two": _calls_two,
    "calls_one_not_a_child": _calls_one_not_a_child,
    "calls_then_retries": _calls_then_retries,
    "calls_in_a_transaction": _calls_in_a_transaction,
    "sends_with_links": _sends_with_links,
    "ends_chain": _ends_chain,
    "count_run": _count_run,
    "call_fields": _call_fields,
    "acks_late": _add,
    "untyped": _add,
    "start_hooked": _hooked,
    "wrapped": _wrapped,
    "boom_carrying": _boom_carrying,
    "big_result": _big_result,
    "length": _length,
}

# Celery's options, the same on both apps. A task that raises declares max_retries=0 where
# Celery would fail it at once: jobsapp retries by default (docs/celery-compat.md).
OPTIONS: Mapping[str, Mapping[str, Any]] = {
    "boom": {"max_retries": 0},
    "request_seen": {"bind": True},
    "progress": {"bind": True},
    "missing": {"autoretry_for": (KeyError,), "max_retries": 1, "default_retry_delay": 0},
    "retried_out": {"bind": True},
    "retry_with_exc": {"bind": True},
    "flaky": {"bind": True},
    "flaky_auto": {
        "autoretry_for": (ConnectionError,),
        "max_retries": 2,
        "default_retry_delay": 0,
    },
    "thrown": {"throws": (KeyError,), "max_retries": 0},
    "hang": {"time_limit": 1, "max_retries": 0},
    "held_once": {"max_retries": 0},
    "soft": {"soft_time_limit": 1, "time_limit": 5},
    "soft_uncaught": {"soft_time_limit": 1, "time_limit": 5, "max_retries": 0},
    "replaced": {"bind": True},
    "get_inside": {"bind": True},
    "opaque": {"max_retries": 0},
    "hooked": {"bind": True, "base": Hooked, "max_retries": 1},
    "start_hooked": {"bind": True, "base": StartHooked, "max_retries": 1},
    "tenant": {"bind": True},
    "queue_seen": {"bind": True},
    "quiet": {"ignore_result": True},
    "short_lived": {"expires": 1},
    "get_allowed": {"bind": True},
    "whereabouts": {"bind": True},
    "lineage": {"bind": True},
    "sends_lineage": {"bind": True},
    "step_lineage": {"bind": True},
    "sends_chain": {"bind": True},
    "sends_group": {"bind": True},
    "sends_chord": {"bind": True},
    "calls_two": {"bind": True},
    "calls_one_not_a_child": {"bind": True},
    "calls_then_retries": {"bind": True, "max_retries": 2},
    "calls_in_a_transaction": {"bind": True},
    "sends_with_links": {"bind": True},
    "ends_chain": {"bind": True},
    "call_fields": {"bind": True, "time_limit": 30, "soft_time_limit": 20},
    "acks_late": {"acks_late": True, "reject_on_worker_lost": True},
    "untyped": {"typing": False, "max_retries": 0},
    "wrapped": {"max_retries": 0},
    "boom_carrying": {"max_retries": 0},
}
