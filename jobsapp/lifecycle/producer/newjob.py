"""A run's row from a task's declaration and one call's arguments (``journal.NewJob``).

What ``LifecycleTask`` hands the journal, decided before anything is written: the job id
(the caller's, the task's ``derive_job_id``, or a new one), the arguments bound to the
body's signature by name and checked for JSON, the concurrency key rendered from them, the
row's values, and when the first attempt is due. The producer builds one in
``apply_async``/``enqueue_in`` (and beat's periodic entries through ``new_job``); the worker
builds one for a delivery the journal has no row for, a plain Celery call (``send_task``
by name, ``apply()``) or a foreign producer's message, and ``claim`` inserts it.
"""

from __future__ import annotations

import inspect
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from celery._state import get_current_worker_task
from celery.app.task import Context
from kombu import Queue

from jobsapp.lifecycle.journal import NewJob
from jobsapp.lifecycle.journal.outbox_rows import LINEAGE, SHADOW
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules import message
from jobsapp.lifecycle.rules.errors import ArgumentRefused, InvalidMessage
from jobsapp.lifecycle.rules.results import NotJson, hint, non_json, stored_arguments
from jobsapp.lifecycle.transport import tracing
from jobsapp.settings import get_settings


class Declared(Protocol):
    """What a task declares about its runs (``LifecycleTask`` is one)."""

    name: str

    # Read-only, so that the class-level declarations of a task satisfy them.
    @property
    def run_table(self) -> RunTable: ...

    @property
    def max_attempts(self) -> int: ...

    @property
    def dedup_window(self) -> float: ...

    @property
    def _signature(self) -> inspect.Signature: ...

    @property
    def checks_call(self) -> bool: ...

    def concurrency_key(self, job_id: uuid.UUID, values: Mapping[str, Any]) -> str: ...

    def derive_job_id(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> uuid.UUID | None: ...

    def row_values(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]: ...

    @property
    def key_limit(self) -> int | None: ...


def require_json(task: str, named: Mapping[str, Any]) -> None:
    """Refuse an argument the journal cannot store, before anything is written."""
    if not named or non_json(named) is None:  # one pass over all; per argument to name it
        return
    for name, value in named.items():
        bad = non_json(value)
        if bad is not None:
            raise ArgumentRefused(
                f"argument {name!r} of {task} is a {bad.__name__}, not JSON: {hint(bad)}"
            )


def key_of(task: str, template: str | None, job_id: uuid.UUID, values: Mapping[str, Any]) -> str:
    """The concurrency key ``template`` renders over the body's arguments by name; with no
    template, a key of the job's own (no other job waits for it)."""
    if template is None:
        return f"{task}:{job_id}"
    return template.format(job_id=job_id, **values)


def key_limit_of(name: str, limit: int, fair: bool, fair_window: int) -> int | None:
    """What a task's runs write as ``key_limit`` (pure): None for one active run per key
    (the unique index), else how many slots its key has (docs/flow-control.md)."""
    if limit < 1 or fair_window < 1:
        raise ValueError(f"{name}: limit and fair_window count runs: at least 1")
    if fair and limit > 1:
        raise ValueError(
            f"{name}: limit={limit} already bounds each key's messages in the "
            "broker; fair=True is for keys with no limit"
        )
    if fair:
        return fair_window
    return limit if limit > 1 else None


def row_values(
    spec: RunTable, task: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The run row's own columns: the arguments (``params_column``, as kombu's JSON encodes
    them: ``results.stored``; ``NotJson`` for a value it cannot carry) or the domain's ids."""
    if spec.params_column is not None:
        call = {"args": list(args), "kwargs": dict(kwargs)}
        return {spec.params_column: stored_arguments(task, call, get_settings().args_max_bytes)}
    if args or set(kwargs) != set(spec.id_columns):
        raise TypeError(f"{task} takes exactly the keyword ids {spec.id_columns}")
    return dict(kwargs)


def named(task: Declared, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The body's arguments by name, defaults included, for the key template; none for a
    call that does not fit a task that does not check its calls (``checks_call``)."""
    try:
        bound = task._signature.bind(*args, **kwargs)
    except TypeError as bad:
        if not task.checks_call:
            return {}
        raise _refusal(task, args, kwargs, bad) from None
    bound.apply_defaults()
    return dict(bound.arguments)


# A call's own ``root_id`` and ``parent_id`` (None where it names none: the sender's then).
GivenLineage = tuple[str | None, str | None]


def build(
    task: Declared,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    job_id: uuid.UUID | None,
    *,
    by_caller: bool = False,
    lineage: GivenLineage | None = None,
) -> NewJob:
    """The run of one call; ``by_caller``: built where the call is made (not from a
    delivered message, whose headers carry its lineage), so a calling task's body is its
    sender, and ``lineage`` the call's own root and parent if it names them
    (``_with_sender``; its first message carries them too, ``NewJob.lineage``)."""
    own = None if lineage is None else lineage_of(lineage)  # a plain call: no lookup
    job_id = job_id or task.derive_job_id(args, kwargs) or uuid.uuid4()
    values_by_name = named(task, args, kwargs)
    try:
        values = task.row_values(args, kwargs)
    except NotJson:
        require_json(task.name, values_by_name)  # names the argument
        raise
    return NewJob(
        spec=task.run_table,
        job_id=job_id,
        task_name=task.name,
        concurrency_key=task.concurrency_key(job_id, values_by_name),
        max_attempts=task.max_attempts,
        values=_with_sender(task.run_table, values, own) if by_caller else values,
        dedup_window=timedelta(seconds=task.dedup_window),
        traceparent=tracing.outgoing().get("traceparent"),
        queue=getattr(task, "queue", None),
        priority=getattr(task, "priority", None),
        key_limit=task.key_limit,
        lineage=own,
    )


def _with_sender(
    spec: RunTable, values: dict[str, Any], given: GivenLineage | None = None
) -> dict[str, Any]:
    """``values``, and when a task's body makes the call, the sender's ``root_id`` and
    ``parent_id`` (what Celery's ``send_task`` stamps on its message) kept beside the
    arguments: every attempt's body sees them whoever publishes its message, the caller's
    fast path or beat's relay, which has no calling task. A call that names its own
    (``given``: ``apply_async(root_id=, parent_id=)``, as Celery's tracer sends a
    ``link``, completed by the sender's: ``lineage_of``) keeps those. A run table that
    keeps only ids has no place for them (its message's headers say what they carry)."""
    column = spec.params_column
    if column is None:
        return values
    found = sender() if given is None else given  # a plain call: one lookup
    if found is None:
        return values
    root, parent = found
    return {**values, column: {**values[column], LINEAGE: {"root_id": root, "parent_id": parent}}}


def lineage_of(given: GivenLineage | None) -> GivenLineage | None:
    """The root and parent a call descends from: its own where it names them
    (``apply_async(root_id=, parent_id=)``), else the calling task's (``sender``), as
    ``send_task`` takes them; None for a call from outside any task that names none."""
    found = sender()
    if given is None:
        return found
    root, parent = found or (None, None)
    return given[0] or root, given[1] or parent


def sender() -> tuple[str, str] | None:
    """The task whose body is making a call: its root and its id, as its body sees them
    (None outside a worker's task); a call, or a canvas, it sends descends from it."""
    current = get_current_worker_task()
    if current is None:
        return None
    request = current.request
    return str(request.root_id or request.id), str(request.id)


def job_id_of(task: str, job_id: uuid.UUID | str | None, task_id: str | None) -> uuid.UUID | None:
    """``job_id`` (a UUID), else the job ``task_id`` names (message.job_id_of_task)."""
    if not job_id:
        return message.job_id_of_task(str(task_id)) if task_id else None
    try:
        return uuid.UUID(str(job_id))
    except ValueError:
        hint = f"pass task_id={str(job_id)!r} for an id of your own"
        raise ValueError(
            f"{task}.apply_async: job_id must be a UUID, not {job_id!r}; {hint}"
        ) from None


def _absolute(eta: datetime | None) -> datetime | None:
    if eta is None:
        return None
    return eta if eta.tzinfo else eta.replace(tzinfo=UTC)


def _countdown(countdown: float | None) -> timedelta | None:
    """A countdown stays a duration: the database adds it to its own clock."""
    return timedelta(seconds=countdown) if countdown else None


def _expiry(expires: float | datetime | None) -> datetime | None:
    """Celery's ``expires`` (seconds from now, or a datetime) as an absolute time; as in
    Celery, seconds count on the producer's clock."""
    if expires is None or isinstance(expires, datetime):
        return _absolute(expires)
    return datetime.now(UTC) + timedelta(seconds=expires)


def bounded_seconds(option: str, value: float | None) -> float | None:
    """A time limit as the message carries it, or a canvas step's countdown (None or 0:
    none, as Celery reads it); anything but seconds up to a year is refused."""
    if not value:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not 0 < seconds <= message.MAX_TIME_LIMIT:
        raise ValueError(
            f"{option} must be between 0 and {message.MAX_TIME_LIMIT} seconds, not {value!r}"
        )
    return seconds


def due_at(job: NewJob, countdown: float | None, eta: datetime | None) -> NewJob:
    """``job`` due when Celery's ``countdown`` or ``eta`` says (an eta wins), as
    ``scheduled`` makes a call's (which sets it in its one ``replace``: a ``.delay()``
    pays for one)."""
    return replace(
        job,
        not_before=_absolute(eta),
        delay=None if eta is not None else _countdown(countdown),
    )


def scheduled(
    job: NewJob,
    *,
    countdown: float | None,
    eta: datetime | None,
    headers: Mapping[str, Any] | None,
    queue: str | Queue | None,
    priority: int | None,
    expires: float | datetime | None = None,
    time_limit: float | None = None,
    soft_time_limit: float | None = None,
    shadow: str | None = None,
) -> NewJob:
    """``job`` with ``apply_async``'s options: when it is due (and when it expires), the
    caller's trace, where (and how urgently) its first message goes, the time limits of
    its call and its display name (every attempt's message carries them, as Celery's
    does)."""
    traceparent = (headers or {}).get("traceparent") or job.traceparent
    return replace(
        job,
        values=_with_call(job, headers or None, shadow) if headers or shadow else job.values,
        not_before=_absolute(eta),
        traceparent=traceparent,
        delay=None if eta is not None else _countdown(countdown),
        queue=queue_name(job.task_name, queue) or job.queue,
        priority=job.priority if priority is None else priority,
        expires_at=_expiry(expires),
        time_limit=bounded_seconds("time_limit", time_limit),
        soft_time_limit=bounded_seconds("soft_time_limit", soft_time_limit),
    )


# What Celery's request holds of its own: a call's header of one of these names would hide it.
_REQUEST_FIELDS = frozenset(
    k for k, v in vars(Context).items() if not k.startswith("_") and not callable(v)
)
# jobsapp's own fields of a worker's request (whether it sends task events): not a call's.
_OWN_FIELDS = "jobsapp_"
# Where a plain call's link/link_error signatures are kept beside its arguments: Celery's
# tracer sends them after the attempt that ends the run, whichever attempt that is.
LINKS = "links"


def queue_name(task: str, queue: str | Queue | None) -> str | None:
    """The name of the queue a call names, as the run keeps it; a kombu ``Queue`` routed
    by its name (its exchange and routing key Celery's defaults for it), else refused:
    a run's retries and republishes are routed by the name it keeps."""
    if not isinstance(queue, Queue):
        return queue
    if queue.exchange.name not in ("", queue.name) or queue.routing_key not in ("", queue.name):
        raise TypeError(
            f"{task}.apply_async: queue {queue.name!r} routes by exchange "
            f"{queue.exchange.name!r} and routing key {queue.routing_key!r}: declare it in "
            "task_queues and pass queue= its name"
        )
    return str(queue.name)


def _with_headers(job: NewJob, headers: Mapping[str, Any]) -> Mapping[str, Any]:
    """The run's columns with the call's own headers (``apply_async(headers=...)``) kept
    beside its arguments: every attempt's body reads them from ``self.request``, as a
    Celery task reads its message's headers, and a retry keeps them as Celery's does."""
    own = {k: v for k, v in headers.items() if k != "traceparent"}  # the trace: a column
    if not own:
        return job.values
    taken = sorted(k for k in own if k in _REQUEST_FIELDS or k.startswith(_OWN_FIELDS))
    if taken:
        raise TypeError(
            f"{job.task_name}.apply_async: headers {taken} are fields of Celery's request "
            "(self.request) or jobsapp's (jobsapp_*); give yours other names"
        )
    column = _call_column(job, "headers")
    require_json(job.task_name, {f"header {k}": v for k, v in own.items()})
    stored = stored_arguments(job.task_name, own, get_settings().args_max_bytes)
    return {**job.values, column: {**job.values[column], "headers": stored}}


def _with_call(job: NewJob, headers: Mapping[str, Any] | None, shadow: Any) -> Mapping[str, Any]:
    """``job``'s values with what its call keeps beside its arguments for every attempt:
    its own ``headers`` and its display name (``shadow``), each when given."""
    values = _with_headers(job, headers) if headers is not None else job.values
    return _with_shadow(job, values, shadow) if shadow else values


def _with_shadow(job: NewJob, values: Mapping[str, Any], shadow: Any) -> Mapping[str, Any]:
    """``values`` with the call's display name (``apply_async(shadow=...)``) kept beside its
    arguments: every attempt's message carries it in Celery's ``shadow`` header (the name
    logs, events and Flower show, a retry's too, as Celery's retries keep it), whoever
    publishes it; the run, its task and its result stay the task's own."""
    require_name(f"{job.task_name}.apply_async", shadow)
    column = _call_column(job, "shadow")
    return {**values, column: {**values[column], SHADOW: shadow}}


def require_name(where: str, shadow: Any) -> None:
    """A ``shadow`` is a name to show (a header's string), refused in one line otherwise."""
    if not isinstance(shadow, str):
        raise TypeError(f"{where}: shadow is a name to show, a string, not {type(shadow).__name__}")


def _call_column(job: NewJob, option: str) -> str:
    """The column where ``job``'s run table keeps the call, for ``option`` kept beside it."""
    column = job.spec.params_column
    if column is None:
        raise TypeError(
            f"{job.task_name}.apply_async: {option}= needs a run table that keeps the call "
            f"(a params column); {job.spec.module!r} keeps only its ids"
        )
    return column


def adopted(
    task: Declared,
    task_id: str,
    traceparent: str | None,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    timelimit: Sequence[float | None] | None = None,
    headers: Mapping[str, Any] | None = None,
    links: Mapping[str, Sequence[Any] | None] | None = None,
    shadow: str | None = None,
) -> tuple[message.Envelope, NewJob]:
    """A plain Celery call (``send_task`` by name, ``apply()``) as a run of its own:
    the job id is the Celery task id, the arguments are bound to the body's signature,
    and the message's ``timelimit`` header (hard, soft), its own ``headers``, its
    ``links`` (``callbacks``, ``errbacks``: ``send_task(link=, link_error=)``) and its
    ``shadow`` (``send_task(shadow=)``) are kept for its retries too. Only a task whose
    arguments the journal keeps (``params_column``) takes one."""
    if task.run_table.params_column is None:
        raise InvalidMessage(
            f"{task.run_table.module} tasks take the jobsapp message "
            "only: enqueue with apply_async from code that imports "
            "the task"
        )
    try:
        task._signature.bind(*args, **kwargs)
    except TypeError as bad:
        # The reason first: "token): missing" would read as a secret to the scrubber.
        raise InvalidMessage(f"{bad}; {task.name} takes {_parameters(task)}") from None
    job_id = message.job_id_of_task(task_id)
    try:
        job = build(task, tuple(args), dict(kwargs), job_id)
        hard, soft = (*(timelimit or ()), None, None)[:2]
        job = replace(
            job,
            values=_with_call(job, _callers(headers) if headers else None, shadow),
            time_limit=bounded_seconds("time_limit", hard),
            soft_time_limit=bounded_seconds("soft_time_limit", soft),
        )
        kept_links = {k: list(v) for k, v in (links or {}).items() if v}
        if kept_links:
            column = task.run_table.params_column
            params = {**job.values[column], LINKS: kept_links}
            job = replace(job, values={**job.values, column: params})
    except (TypeError, ValueError) as bad:
        raise InvalidMessage(str(bad)) from None
    env = message.adopted(job_id, task.run_table.module, traceparent)
    return env, job


def _callers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """A delivered message's own headers (Celery's ``request.headers``) but jobsapp's."""
    return {k: v for k, v in headers.items() if not k.startswith(_OWN_FIELDS)}


def _parameters(task: Declared) -> inspect.Signature:
    """The body's parameters as a person writes the call: names and defaults."""
    sig = task._signature
    bare = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
    return sig.replace(parameters=bare, return_annotation=sig.empty)


def foreign(task: Declared, env: message.Envelope) -> NewJob | None:
    """The row to insert for a message whose producer kept no journal row."""
    if env.outbox_id is not None:
        return None
    try:
        job = build(task, (), env.ids, env.job_id)
    except (TypeError, ValueError) as bad:
        raise InvalidMessage(f"cannot build a run from the message: {bad}") from None
    if env.concurrency_key:
        return replace(job, concurrency_key=env.concurrency_key)
    return job


def _refusal(
    task: Declared, args: tuple[Any, ...], kwargs: Mapping[str, Any], bad: TypeError
) -> TypeError:
    """A call that does not fit the body, in the words Celery's ``delay()`` uses (its own
    check, ``Task.__header__``), or the binding's when the task has none."""
    header = getattr(task, "__header__", None)
    try:
        if header is not None:
            header(*args, **kwargs)
    except TypeError as celerys:
        return celerys
    return TypeError(f"{task.name}: {bad}")
