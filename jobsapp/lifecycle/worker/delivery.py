"""A delivered message's path through a lifecycle task (``LifecycleTask.__call__``): the
envelope, the claim, the attempt, and what Celery is told of its end.

``deliver`` reads the message (a plain Celery call becomes a run of its own, a foreign
producer's message brings its row), claims the run through the task's gate
(worker/claim.py), and hands the attempt to ``attempt.run_attempt`` with the body's call:
the body sees ``self.request`` as Celery's would. Under ``apply()`` it runs attempt after
attempt here until the job ends. What the task declares (its table, rate, heartbeat, time
limit, retry rules) is read from the task (``Worked``).
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import cache, partial
from typing import Any, Protocol

from celery import Celery, Task, group, signature
from celery.app.task import Context
from celery.canvas import Signature
from celery.utils.time import maybe_make_aware
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from jobsapp import logs
from jobsapp.db import get_engine
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.celery_api import errback, task_hooks
from jobsapp.lifecycle.flow import gating
from jobsapp.lifecycle.journal import NewJob, Run
from jobsapp.lifecycle.journal.outbox_rows import LINEAGE
from jobsapp.lifecycle.journal.run import Call, worker_of
from jobsapp.lifecycle.journal.schema_checked import SchemaChecked
from jobsapp.lifecycle.producer import newjob
from jobsapp.lifecycle.rules import message
from jobsapp.lifecycle.rules.errors import (
    InvalidMessage,
    Logged,
    PermanentError,
    RetryRequested,
)
from jobsapp.lifecycle.rules.scrub import known_secrets_from_env
from jobsapp.lifecycle.transport import publisher, tracing
from jobsapp.lifecycle.worker import claim, key_limits, timeouts
from jobsapp.lifecycle.worker.attempt import AttemptRules, End, Ended, run_attempt
from jobsapp.lifecycle.worker.celery_view import (
    EVENTS_ON,
    AttemptFailed,
    call_fields,
    report,
    send_started,
)
from jobsapp.lifecycle.worker.context import RunContext
from jobsapp.lifecycle.worker.heartbeat import Heartbeat
from jobsapp.settings import Settings, get_settings

log = logging.getLogger(__name__)


class Worked(newjob.Declared, Protocol):
    """What a delivery reads of its task (``LifecycleTask`` is one)."""

    # Read-only, so that the class-level declarations of a task satisfy them.
    @property
    def app(self) -> Celery: ...

    @property
    def request(self) -> Context: ...

    @property
    def fair(self) -> bool: ...

    @property
    def heartbeat_interval(self) -> float | None: ...

    @property
    def time_limit(self) -> float | None: ...

    @property
    def rate(self) -> str | None: ...

    @property
    def rate_key(self) -> str | None: ...

    @property
    def hooked(self) -> bool: ...

    @property
    def around_body(self) -> Callable[..., Any] | None: ...

    def attempt_rules(self, inline_wait_max: float) -> AttemptRules: ...

    def run(self, *args: Any, **kwargs: Any) -> Any: ...

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None: ...

    @property
    def request_stack(self) -> Any: ...

    def push_request(self, **fields: Any) -> None: ...


def retry_requested(
    task: Worked,
    args: Any,
    kwargs: Any,
    exc: BaseException | None,
    eta: Any,
    countdown: float | None,
    max_retries: int | None,
) -> BaseException:
    """What the body's ``self.retry(...)`` raises: the next attempt due after ``countdown``
    seconds or at ``eta``, else after the task class's own ``default_retry_delay`` if it
    declares one, else after the retry policy's backoff (docs/lifecycle.md)."""
    if args is not None or kwargs is not None:
        # A mistake in the call, not a passing fault: the run fails, never retried.
        return PermanentError(
            f"{task.name}.retry: args/kwargs cannot change on a retry: "
            "the next attempt runs the job's own arguments",
            error_code="retry_arguments",
        )
    if isinstance(exc, RetryRequested):
        # autoretry_for=(Exception,) caught the body's own self.retry(): Celery lets
        # its Retry through, so the body's countdown and max_retries stand.
        return exc
    if eta is not None:
        countdown = max(0.0, (maybe_make_aware(eta) - task.app.now()).total_seconds())
    elif countdown is None:
        countdown = _declared_retry_delay(type(task))
    return RetryRequested(exc, countdown, max_retries)


def _declared_retry_delay(cls: type) -> float | None:
    """Celery's ``default_retry_delay`` where the task's classes declare it; Celery's own
    default (180 s, on its ``Task``) gives way to the retry policy's backoff."""
    for klass in cls.__mro__:
        if klass is Task:
            return None
        if "default_retry_delay" in klass.__dict__:
            delay = klass.__dict__["default_retry_delay"]
            return None if delay is None else float(delay)
    return None


@cache
def process_secrets() -> tuple[str, ...]:
    """Secret values of this process's environment, read once: scrubbed from every error."""
    return known_secrets_from_env(os.environ)


def deliver(
    task: Worked, request: Context, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    """What Celery's tracer gets from the task for one delivery (or ``apply()``); ``request``
    is the task's Celery request, read once (each read is a lookup on Celery's stack)."""
    eager = bool(request.is_eager)
    try:
        env, foreign = _delivered(task, request, args, kwargs, eager)
    except InvalidMessage as bad:
        if eager:  # apply(): the caller hears it, as from a call that does not fit
            raise TypeError(f"{task.name}: {bad}") from None
        log.error("rejected message %s for %s: %s", request.id, task.name, bad)
        raise Logged(str(bad), requeue=False) from None
    job = str(env.job_id)
    # The run's span (continuing the message's trace) and its log records' fields.
    span = tracing.span(
        f"run {task.name}",
        {"traceparent": env.traceparent},
        consumer=True,
        attributes={
            "jobsapp.job_id": job,
            "jobsapp.attempt": env.attempt,
            "jobsapp.module": env.module,
            "jobsapp.task": task.name,
        },
    )
    with span, logs.about_job(job_id=job, attempt=env.attempt, module=env.module, task=task.name):
        if eager:
            return _run_eagerly(task, request, env, job, foreign)
        ended = _run_envelope(task, request, env, job, foreign)
    if (request.callbacks or request.errbacks) and not _ends_run(ended):
        # Celery's tracer would send them after a delivery that did not end the run (a
        # copy refused, a lease lost), a refusal's text as the callback's argument.
        request.callbacks = request.errbacks = None
    if task.hooked:
        _ended_for_hooks(request, ended)
    return reported(env, ended, str(request.id))


def _ended_for_hooks(request: Context, ended: Ended | str) -> None:
    """The exception the body raised, for the task's own hooks (``task_hooks``)."""
    view = request.get(task_hooks.VIEW)
    if view is not None and isinstance(ended, Ended):
        view.error = ended.error


def _delivered(
    task: Worked, request: Context, args: tuple[Any, ...], kwargs: Mapping[str, Any], eager: bool
) -> tuple[message.Envelope, NewJob | None]:
    """The attempt a delivery asks for, and the row to insert if the journal has none."""
    if eager or not message.is_envelope(args, kwargs):
        return newjob.adopted(
            task,
            str(request.id),
            request.get("traceparent"),
            args,
            kwargs,
            request.timelimit,
            request.headers,
            {"callbacks": request.callbacks, "errbacks": request.errbacks},
            request.shadow,
        )
    env = message.parse(args, kwargs)
    if env.module != task.run_table.module:
        raise InvalidMessage(f"module {env.module!r} is not {task.run_table.module!r}")
    return env, newjob.foreign(task, env)


def _run_eagerly(
    task: Worked, request: Context, env: message.Envelope, job: str, foreign: NewJob | None
) -> Any:
    """``apply()``: attempt after attempt here, through the journal, until the job
    ends (a pause between attempts is waited out). Returns what the body returned or
    raises what it raised, as Celery's eager call does; a job that was already taken
    (the same task id again) returns why it did not run. A journal never migrated is
    the processes' one line (``DatabaseNotMigrated``), as a producer's ``.delay()`` says."""
    with SchemaChecked():
        ended = _run_envelope(task, request, env, job, foreign, eager=True)
        while isinstance(ended, Ended) and ended.end is End.REQUEUED:
            env = replace(env, attempt=env.attempt + 1)
            ended = _run_envelope(task, request, env, job, None, eager=True)
    if isinstance(ended, claim.Refusal):
        return claim.not_run(ended)
    if ended.end is End.SUCCEEDED:
        return ended.value
    if ended.error is not None:
        raise ended.error
    raise AttemptFailed(ended.summary)


def _run_envelope(
    task: Worked,
    request: Context,
    env: message.Envelope,
    job: str,
    foreign: NewJob | None,
    *,
    eager: bool = False,
) -> Ended | claim.Refusal:
    worker, engine, settings = (
        worker_of(request.hostname, os.getpid()),
        get_engine(),
        get_settings(),
    )
    rules = _rules(task, settings, eager)
    wait_early = math.inf if eager else rules.inline_wait_max
    outcome = _claim(task, request, engine, env, foreign, worker, wait_early, eager=eager)
    if isinstance(outcome, claim.Refusal):
        log.info("job %s attempt %s: no work, %s", job, env.attempt, outcome.value)
        return outcome
    row = outcome.row
    if task.fair:
        key_limits.after_fair_claim(task.app, engine, task.run_table, row)
    # Decoded once: for the task event (only when the worker sends events) and the body.
    call = _show_call(task, request, env, job, row) if request.get(EVENTS_ON) else None
    interval = task.heartbeat_interval or settings.heartbeat_interval
    ctx = RunContext(
        engine=engine,
        spec=task.run_table,
        row=row,
        worker=worker,
        heartbeat=Heartbeat(
            engine,
            task.run_table,
            env.job_id,
            env.attempt,
            interval,
            settings.stale_after,
            token=row.claimed_token,
        ),
    )
    at_limit = None if eager else _limited(task, request, ctx, rules)
    kept = _kept(task, row, job)
    lineage = _lineage(request, env, job) if kept is None else kept
    _kept_links(task, row, request, job, ctx)
    ended = run_attempt(task.app, ctx, lambda: call_body(task, row, job, lineage, call, ctx), rules)
    if at_limit is not None:
        ended = at_limit.instead_of(ended)
    if ended.end is End.LEASE_LOST:
        _after_lost_lease(task, engine, env, ctx.token)
    return ended


def _limited(
    task: Worked, request: Context, ctx: RunContext, rules: AttemptRules
) -> timeouts.AtLimit | None:
    """The journal's end of this attempt at its hard time limit, if it has one: the
    only limit under the threads and solo pools (lifecycle/worker/timeouts.py)."""
    seconds = timeouts.hard_limit(request.timelimit, task.time_limit, task.app)
    if seconds is None:
        return None
    at_limit = timeouts.AtLimit(task.app, ctx, rules, seconds)
    ctx.heartbeat.limit(seconds, at_limit)
    return at_limit


def _after_lost_lease(
    task: Worked, engine: Engine, env: message.Envelope, token: uuid.UUID
) -> None:
    """Name a claim lost in a database crash (it did not wait for the flush). A run
    still queued before this attempt: hand the message back so that it is claimed again
    now, rather than after the relay's unclaimed check. Claimed again by another
    worker: that claim alone holds the run; this message is done. Either way the body
    ran and may run again, as after a worker crash mid-run."""
    try:
        with engine.connect() as conn:
            row = journal.load(conn, task.run_table, env.job_id)
    except OperationalError:
        return  # the relay's unclaimed check republishes it
    lost = claim.claim_lost(row, env.attempt, token)
    if lost is claim.LostClaim.UNCLAIMED:
        log.warning(
            "job %s attempt %s: its claim was lost in a database crash; requeueing the message",
            env.job_id,
            env.attempt,
        )
        raise Logged("claim lost in a database crash", requeue=True)
    if lost is claim.LostClaim.RECLAIMED and row is not None:
        log.warning(
            "job %s attempt %s: its claim was lost in a database crash; the "
            "attempt was claimed again by %s, whose claim alone is honoured",
            env.job_id,
            env.attempt,
            row.worker,
        )


def _claim(
    task: Worked,
    request: Context,
    engine: Engine,
    env: message.Envelope,
    foreign: NewJob | None,
    worker: str,
    wait_early: float,
    *,
    eager: bool = False,
) -> claim.Claimed | claim.Refusal:
    try:
        return claim.claim(
            engine,
            task.run_table,
            env,
            foreign=foreign,
            worker=worker,
            wait_early=wait_early,
            gate=claim_gate(task),
            due_now=eager,
        )
    except InvalidMessage as bad:
        log.error("rejected message %s for %s: %s", request.id, task.name, bad)
        raise Logged(str(bad), requeue=False) from None
    except OperationalError as down:
        if eager:  # apply(): the caller hears it (FAILURE), as from its own query
            raise
        # The journal is unreachable: hand the message back rather than ack it unrun.
        log.warning(
            "claim of job %s failed, requeueing the message: %s",
            env.job_id,
            type(down.orig).__name__,
        )
        time.sleep(1.0)
        raise Logged("journal unavailable", requeue=True) from None


def gate(task: Worked) -> gating.Gate:
    """What flow control checks before a run of ``task`` starts."""
    return _gate_of(task, claim.claim_holds(task.app))


def claim_gate(task: Worked) -> gating.Gate | None:
    """The gate of ``task``'s claims; None (a claim of one statement that enters no flow
    code) for a task with no rate on an app with no claim hold."""
    holds = claim.claim_holds(task.app)
    return _gate_of(task, holds) if holds or task.rate is not None else None


def _gate_of(task: Worked, holds: tuple[gating.Hold, ...]) -> gating.Gate:
    """The gate, built once per task and set of holds (a hold registered later gives
    its app a new tuple)."""
    kept: gating.Gate | None = task.__dict__.get("_kept_gate")
    if kept is None or kept.holds is not holds:
        rate = gating.parse_rate(task.rate) if task.rate else None
        queue = str(task.app.conf.task_default_queue)
        kept = task.__dict__["_kept_gate"] = gating.Gate(
            task.name, queue, rate, partial(_rate_key_of, task), holds
        )
    return kept


def _rate_key_of(task: Worked, row: Run) -> str:
    if task.rate_key is None:
        return ""
    args, kwargs, _ = row.call(task.run_table)
    values = newjob.named(task, args, kwargs)
    return task.rate_key.format(**{"concurrency_key": row.concurrency_key, **values})


def _rules(task: Worked, settings: Settings, eager: bool) -> AttemptRules:
    """``attempt_rules`` for a worker's (or, ``eager``, an ``apply()``'s) attempts,
    built once per task and settings: none of it changes from job to job."""
    kept = task.__dict__.get("_kept_rules")
    if kept is None or kept[0] is not settings:
        rules = task.attempt_rules(settings.inline_wait_max)
        kept = task.__dict__["_kept_rules"] = (
            settings,
            {False: rules, True: replace(rules, publish_retry=False)},
        )
    rules_of: dict[bool, AttemptRules] = kept[1]
    return rules_of[eager]


# What a canvas step's body finds in ``self.request.chain``: Celery's holds the chain's later
# signatures, here in the journal (a body that empties it ends its chain, as in Celery).
REST_OF_CANVAS = {"jobsapp": "the rest of this canvas is kept in the journal"}
# The body's root_id, parent_id and group.
Lineage = tuple[str, str | None, str | None]


def _lineage(request: Context, env: message.Envelope, job: str) -> Lineage:
    """The body's ``root_id`` and ``parent_id``, as Celery gives a task its sender's. A
    message names this job's attempts (its own task id; after the first attempt, the first
    attempt's and the previous one's, for Flower's retry tree): to the body that is the job
    itself: a root of its own with no parent, and a later attempt's parent the job (a
    retry is sent by the task). A job sent from another job's body keeps that job's (its
    first attempt; a later one is its own root)."""
    root, parent = request.root_id, request.parent_id
    if env.attempt == 1:
        return (job if root is None or root == request.id else root), parent, request.group
    if root is None or root == message.task_id_for(env.job_id, 1):
        root = job
    if parent == message.task_id_for(env.job_id, env.attempt - 1):
        parent = job
    return root, parent, request.group


def _kept(task: Worked, row: Run, job: str) -> Lineage | None:
    """The lineage the journal keeps with the run, every attempt alike (a Celery retry
    keeps its request's): a canvas step's, as its place and the step that started it say
    (journal/workflow.py), or a call's from a task's body, its sender's (producer/newjob.py).
    None for a run that keeps none: its message's (``_lineage``)."""
    spec = task.run_table
    kept = (row.columns[spec.params_column] or {}).get(LINEAGE) if spec.params_column else None
    if kept is None:
        return None
    return kept["root_id"] or job, kept.get("parent_id"), kept.get("group")


def _ends_run(ended: Ended | str) -> bool:
    return isinstance(ended, Ended) and ended.end in (End.SUCCEEDED, End.FAILED)


def _kept_links(task: Worked, row: Run, request: Context, job: str, ctx: RunContext) -> None:
    """A plain call's ``link``/``link_error`` (kept at its adoption, producer/newjob.py) on
    this delivery's request: Celery's tracer sends them once the attempt that ends the run
    returns (its callbacks) or raises (its errbacks), as it sends a message's own. A later
    attempt is jobsapp's message, which carries none."""
    spec = task.run_table
    links = (
        (row.columns[spec.params_column] or {}).get(newjob.LINKS) if spec.params_column else None
    )
    if links:
        errbacks = links.get("errbacks")
        request.callbacks = _named_callbacks(task.app, links.get("callbacks"), ctx)
        later = errbacks and request.id != job  # a retry's id is its attempt's own
        request.errbacks = errback.given_the_job(task.app, errbacks, job) if later else errbacks


def _named_callbacks(app: Celery, callbacks: list[Any] | None, ctx: RunContext) -> list[Any] | None:
    """``callbacks`` as Celery's tracer sends several (each group apart, the other
    callbacks as one group), given their ids now: Celery stores a success with the results
    of the callbacks its tracer sent as its ``children``, and this attempt's success is
    written before the tracer sends them, so it keeps those results (``ctx.callbacks``)."""
    if not callbacks:
        return callbacks
    sigs: list[Signature] = [signature(c, app=app) for c in callbacks]
    if len(sigs) > 1:
        alone = [s for s in sigs if not isinstance(s, group)]
        apart: list[Signature] = [s for s in sigs if isinstance(s, group)]
        sigs = [*apart, group(alone, app=app)] if alone else apart
    ctx.callbacks = [s.freeze() for s in sigs]
    return sigs


def call_body(
    task: Worked,
    row: Run,
    job: str,
    lineage: Lineage,
    call: Call | None = None,
    ctx: RunContext | None = None,
) -> Any:
    """The body, its ``self.request`` the caller's view as in Celery: the job's task id
    (``job``, its ``correlation_id`` too), the body's own arguments (``call``, when already
    decoded), ``retries`` the attempts before this one, its ``root_id``, ``parent_id`` and
    ``group`` (``lineage``), the run's ``expires``. A canvas step's ``chain`` is a list
    that its body may set to None to end its chain, as in Celery (``ctx.chain_ended``)."""
    args, kwargs, headers = call if call is not None else row.call(task.run_table)
    if errback.MARK in kwargs:
        args, kwargs = errback.arguments(task.app, args, kwargs)
    retries, (root_id, parent_id, group) = row.attempts - 1, lineage
    if task.hooked:  # the task's own hooks are given the call as the body sees it
        view = task_hooks.CallView(job, args, kwargs, retries, root_id)
        setattr(task.request, task_hooks.VIEW, view)
    own: dict[str, Any] = {}
    if headers is not None:  # a call's own headers: fields of Celery's request, and its headers
        own = {**headers, "headers": {**(task.request.headers or {}), **headers}}
    around = task.around_body
    if around is not None:
        own[task_hooks.IN_BODY] = True
    if row.expires_at is not None:  # the journal expires the run, not the broker its message
        own["expires"] = row.expires_at.isoformat()
    if row.workflow_id is not None:  # the rest of the canvas is the journal's, not the message's
        own["chain"] = [REST_OF_CANVAS]
    # Celery's push_request copies the current request's fields under these.
    task.push_request(
        **own,
        id=job,
        correlation_id=job,
        args=list(args),
        kwargs=kwargs,
        retries=retries,
        root_id=root_id,
        parent_id=parent_id,
        group=group,
        ignore_result=False,  # the journal keeps every run's value, whatever the call said
    )
    try:
        if task.hooked:  # Celery calls before_start before the body; the tracer's was held
            task.before_start(job, list(args), kwargs)
        value = task.run(*args, **kwargs) if around is None else around(task, *args, **kwargs)
        if ctx is not None and "chain" in own and not task.request.chain:
            ctx.chain_ended = True
        return value
    finally:
        # Popped as Celery's tracer pops it; its children (what the body called, Celery's
        # ``add_trail``) are a plain attribute, None for a body that called nothing.
        popped = task.request_stack.pop()
        if ctx is not None:
            ctx.children = popped._children


# The frame that calls the body: Flower's traceback of a failed attempt starts below it.
BODY_CALL = call_body.__code__


def reported(env: message.Envelope, ended: Ended | claim.Refusal, task_id: str) -> Any:
    """The Celery result or exception of delivery ``task_id`` (``celery_view.report``), a
    failure's traceback starting below the body's call."""
    return report(env, ended, task_id, entry=BODY_CALL, secrets=process_secrets())


def _show_call(task: Worked, request: Context, env: message.Envelope, job: str, row: Run) -> Call:
    """Flower's args and kwargs of this attempt: the body's, and the job it belongs to
    (see ``celery_view``), sent when the worker sends task events; returns the call."""
    call = row.call(task.run_table)
    shown = call_fields(call[0], call[1], process_secrets())
    try:
        send_started(
            task.app,
            str(request.id),
            str(request.hostname),
            {**shown, "job_id": job, "attempt": env.attempt},
        )
    except publisher.BROKER_ERRORS as down:  # a live view; the attempt goes on
        log.info("task event of job %s not sent: %s", job, type(down).__name__)
    return call
