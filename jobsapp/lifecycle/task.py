"""``LifecycleTask``: a Celery task whose every run lives in the journal.

``apply_async``/``delay`` enqueue through the journal and return a ``JobHandle``;
``__call__`` (what the worker runs) validates the message, claims the run, and hands the
attempt to ``attempt.run_attempt``. A plain Celery call of the task (``send_task`` by
name, ``apply()``) becomes a run of its own, keyed by its Celery task id. Idiomatic
``self.retry()`` and ``autoretry_for`` map to the same journal semantics.

The class is the Celery-facing surface; what it hands the journal (the job id, the row's
values, the argument checks, the concurrency key) is built in ``newjob``, and what Celery
and Flower show of an attempt's end in ``celery_view``.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import socket
import string
import time
import uuid
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from functools import cache, cached_property
from typing import Any, ClassVar, NoReturn

from celery import Celery, Task, group
from celery.result import EagerResult
from celery.utils.time import maybe_make_aware
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from jobsapp import logs
from jobsapp.db import get_engine
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.celery_api import group_handles
from jobsapp.lifecycle.celery_api.backend import JournalBackend
from jobsapp.lifecycle.celery_api.backend import for_app as backend_for
from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.flow import gating
from jobsapp.lifecycle.journal import EnqueueOutcome, NewJob, Run, registry, totals
from jobsapp.lifecycle.producer import enqueue, newjob
from jobsapp.lifecycle.rules import message
from jobsapp.lifecycle.rules.errors import (
    InvalidMessage,
    Logged,
    PermanentError,
    Replaced,
    RetryRequested,
)
from jobsapp.lifecycle.rules.results import decoded
from jobsapp.lifecycle.rules.retry import RetryPolicy
from jobsapp.lifecycle.rules.scrub import known_secrets_from_env
from jobsapp.lifecycle.transport import hooks, publisher, tracing
from jobsapp.lifecycle.worker import claim, key_limits, timeouts
from jobsapp.lifecycle.worker.attempt import AttemptRules, End, Ended, run_attempt
from jobsapp.lifecycle.worker.celery_view import (
    EVENTS_ON,
    AttemptFailed,
    call_fields,
    report,
    send_started,
)
from jobsapp.lifecycle.worker.context import RunContext, current_run_or_none
from jobsapp.lifecycle.worker.heartbeat import Heartbeat
from jobsapp.lifecycle.workflows import canvas, errback, replacement
from jobsapp.settings import Settings, get_settings

log = logging.getLogger(__name__)


@cache
def _process_secrets() -> tuple[str, ...]:
    """Secret values of this process's environment, read once: scrubbed from every error."""
    return known_secrets_from_env(os.environ)


# Celery options a lifecycle task cannot honour, and what to do instead.
_UNSUPPORTED = {
    "exchange": "pass queue=, or route the task with task_routes",
    "routing_key": "pass queue=, or route the task with task_routes",
    "retry": "the outbox retries every publish",
    "retry_policy": "the outbox retries every publish",
}


def _refuse(name: str, options: Collection[str]) -> None:
    if not options:
        return
    hints = "; ".join(f"{o}: {_UNSUPPORTED.get(o, 'not supported')}" for o in sorted(options))
    raise TypeError(f"{name}.apply_async: jobsapp does not support {sorted(options)} ({hints})")


def flow_options(cls: type[Task]) -> None:  # type: ignore[type-arg]
    """Refuse Celery's ``rate_limit`` (a cap per worker process: celery#5732) and check
    ``rate`` when the task is declared, not at its first run."""
    if cls.__dict__.get("rate_limit"):
        raise TypeError(
            f"{cls.__dict__.get('name', cls.__name__)}: rate_limit is per worker "
            "process in Celery; use rate='100/m', global across workers"
        )
    if rate := cls.__dict__.get("rate"):
        gating.parse_rate(rate)
    if (template := cls.__dict__.get("rate_key")) and "run" in cls.__dict__:
        named = set(inspect.signature(cls.__dict__["run"]).parameters) | {"concurrency_key"}
        if unknown := {f for _, f, _, _ in string.Formatter().parse(template) if f} - named:
            raise TypeError(
                f"{cls.__dict__.get('name', cls.__name__)}: rate_key names "
                f"{sorted(unknown)}, not arguments of the task"
            )


class LifecycleTask(Task):  # type: ignore[type-arg]
    """Base class of jobsapp tasks; configure with ``jobsapp.lifecycle.lifecycle_task``."""

    run_table: ClassVar[registry.RunTable] = registry.JOBS
    max_attempts: ClassVar[int] = 5
    dedup_window: ClassVar[float] = 0.0
    retry_policy: ClassVar[RetryPolicy] = RetryPolicy()
    permanent_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    # A format string over the body's arguments by name; override concurrency_key() for more.
    key: ClassVar[str | None] = None
    inline_wait_max: ClassVar[float | None] = None
    # At most ``limit`` runs of one key running or published at once, on every host; the
    # rest wait in the journal, holding no worker. 1 is the contract's one active run per
    # key, where a second is ``skipped`` (docs/flow-control.md).
    limit: ClassVar[int] = 1
    # Round-robin between the keys: each key has at most ``fair_window`` messages waiting
    # in the broker, so one tenant's backlog queues behind nobody else's.
    fair: ClassVar[bool] = False
    fair_window: ClassVar[int] = 2
    # Long Retry-After pauses before the job fails with outcome ``snooze_limit``.
    max_snoozes: ClassVar[int] = 10
    heartbeat_interval: ClassVar[float | None] = None
    # A global rate limit ("100/m", kept in the journal: docs/flow-control.md), one per
    # task or, with ``rate_key`` (a format string over the body's arguments by name and
    # ``concurrency_key``), one per key.
    rate: ClassVar[str | None] = None
    rate_key: ClassVar[str | None] = None
    # Celery would check the message kwargs against run()'s signature; ours differ.
    typing = False
    ignore_result = True
    # An attempt's failure is journalled and logged by jobsapp: Celery logs it briefly.
    throws = (AttemptFailed,)
    Request = "jobsapp.lifecycle.worker.celery_view:LifecycleRequest"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Celery's max_retries counts retries; the journal counts attempts.
        if "max_retries" in cls.__dict__ and "max_attempts" not in cls.__dict__:
            retries = cls.__dict__["max_retries"]
            cls.max_attempts = 1_000_000 if retries is None else int(retries) + 1
        # A wrong limit is refused where the task is declared, not at its first enqueue.
        name = str(cls.__dict__.get("name", cls.__qualname__))
        newjob.key_limit_of(name, cls.limit, cls.fair, cls.fair_window)
        flow_options(cls)

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        """Celery's hook when a task joins its app (the app's setup, never an import): from
        then on, Celery's chain, group and chord of lifecycle tasks go through the journal
        (``canvas.install``), the app's fast path leaves a paused queue's messages to the
        relay, and its workers' claims hold them (an operator may pause any queue, so every
        app with a lifecycle task honours it on publish and on claim)."""
        super().on_bound(app)
        canvas.install()
        hooks.add_publish_filter(app, gating.held_while_paused)
        claim.add_claim_hold(app, gating.while_paused)

    # --- producer side -------------------------------------------------------------

    @property
    def key_limit(self) -> int | None:
        """How many slots a key of this task has (None: the one-run-per-key index)."""
        return newjob.key_limit_of(self.name, self.limit, self.fair, self.fair_window)

    def concurrency_key(self, job_id: uuid.UUID, values: Mapping[str, Any]) -> str:
        """Jobs with the same key exclude each other while active (default: none do)."""
        return newjob.key_of(self.name, self.key, job_id, values)

    def derive_job_id(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> uuid.UUID | None:
        """Override to make the job id a function of the arguments (natural idempotency)."""
        del args, kwargs
        return None

    @cached_property
    def _signature(self) -> inspect.Signature:
        """``run``'s signature, read once per task (inspect takes longer than the bind)."""
        return inspect.signature(self.run)

    def row_values(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The run row's own columns (override to write a domain's ids differently)."""
        return newjob.row_values(self.run_table, self.name, args, kwargs)

    def new_job(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any], job_id: uuid.UUID | None
    ) -> NewJob:
        """The run a call of this task writes (see ``newjob``)."""
        return newjob.build(self, args, kwargs, job_id)

    def apply_async(  # type: ignore[override]
        self,
        args: tuple[Any, ...] | list[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        task_id: str | None = None,
        *,
        job_id: uuid.UUID | str | None = None,
        session: Session | None = None,
        connection: Connection | None = None,
        countdown: float | None = None,
        eta: datetime | None = None,
        headers: Mapping[str, Any] | None = None,
        queue: str | None = None,
        priority: int | None = None,
        expires: float | datetime | None = None,
        time_limit: float | None = None,
        soft_time_limit: float | None = None,
        **options: Any,
    ) -> JobHandle | EagerResult:  # type: ignore[type-arg]
        """Enqueue through the journal (idempotent by job_id); publish after COMMIT.

        With ``session`` the enqueue joins that ORM transaction and publishes when it
        commits; with ``connection`` it joins a Core transaction and the relay publishes.
        ``countdown``/``eta`` delay the first attempt in the journal, never in the broker;
        a ``traceparent`` header continues the caller's trace. ``queue`` is stored on the
        run, so retries and republishes go there too, and so is ``priority`` (see
        docs/flow-control.md). ``expires`` (seconds or a datetime, as Celery takes it)
        ends a job still queued then with outcome ``expired``. ``time_limit`` and
        ``soft_time_limit`` bound each attempt of this call, as the task's own would (every
        message of the job carries them). ``link``/``link_error``
        make the call a workflow (lifecycle/workflows/canvas.py). Other Celery options are refused
        with what to do instead.
        Under ``task_always_eager`` it is ``apply()``, as in Celery: the job runs here.
        """
        callbacks = {o: options.pop(o) for o in ("link", "link_error") if options.get(o)}
        _refuse(self.name, options)
        if callbacks and not self.app.conf.task_always_eager:
            others = {
                "job_id": job_id,
                "session": session,
                "connection": connection,
                "countdown": countdown,
                "eta": eta,
                "headers": headers,
                "expires": expires,
                "time_limit": time_limit,
                "soft_time_limit": soft_time_limit,
            }
            _refuse(f"{self.name} with link/link_error", {k for k, v in others.items() if v})
            step = {"task_id": task_id, "queue": queue, "priority": priority}
            return self._with_callbacks(args, kwargs, step, callbacks)
        if self.app.conf.task_always_eager:
            wanted = job_id or task_id
            return self.apply(
                tuple(args or ()), dict(kwargs or {}), task_id=str(wanted) if wanted else None
            )
        wanted = newjob.job_id_of(self.name, job_id, task_id)
        job = newjob.scheduled(
            self.new_job(tuple(args or ()), dict(kwargs or {}), wanted),
            countdown=countdown,
            eta=eta,
            headers=headers,
            queue=queue,
            priority=priority,
            expires=expires,
            time_limit=time_limit,
            soft_time_limit=soft_time_limit,
        )
        handle = enqueue.enqueue(self.app, job, session=session, connection=connection)
        if handle.outcome is EnqueueOutcome.DUPLICATE:
            totals.count_dedup_hit(get_engine(), self.run_table.module, self.name)
        if task_id and not job_id:
            handle.id = str(task_id)  # the caller's own id names its result, as in Celery
        return handle

    def _with_callbacks(
        self,
        args: tuple[Any, ...] | list[Any] | None,
        kwargs: Mapping[str, Any] | None,
        step: Mapping[str, Any],
        callbacks: Mapping[str, Any],
    ) -> JobHandle:
        """A call with ``link``/``link_error``: a workflow of this step and its callbacks
        (lifecycle/workflows/canvas.py); ``step`` holds the options a step keeps."""
        sig = self.s(*(args or ()), **(kwargs or {}))
        sig.set(**{k: v for k, v in step.items() if v is not None})
        handle: JobHandle = canvas.start(sig, None, callbacks)
        return handle

    def AsyncResult(self, task_id: str, **kwargs: Any) -> JobHandle:  # noqa: N802
        """The job's handle (its journal row), for code written against Celery's results.

        A lookup enqueues nothing; its outcome says what a replayed enqueue would: the job
        id is taken."""
        del kwargs
        job_id = message.job_id_of_task(str(task_id))
        # A workflow step that will not run (what it waited for failed) answers FAILURE.
        return group_handles.StepHandle(
            job_id,
            EnqueueOutcome.DUPLICATE,
            self.run_table,
            task=self.name,
            task_id=str(task_id),
            app=self.app,
        )

    @property  # type: ignore[override]
    def backend(self) -> JournalBackend:
        """The journal answers for this task's results, whatever the app's backend is (a
        team's plain tasks keep theirs)."""
        return backend_for(self.app)

    @backend.setter
    def backend(self, value: Any) -> None:
        del value  # Celery sets the app's backend on bound tasks; the journal stays theirs

    def update_state(
        self,
        task_id: str | None = None,
        state: str | None = None,
        meta: Any = None,
        **kwargs: Any,
    ) -> None:
        """Celery's ``update_state`` from the body: ``state`` and ``meta`` kept on the run
        (fenced by its claim), read back by ``AsyncResult(id).state``/``.info``. Another
        task's id, or a call outside a run, goes to Celery (the journal keeps no state of
        a run it does not hold)."""
        ctx = current_run_or_none()
        if ctx is None or (
            task_id is not None and message.job_id_of_task(str(task_id)) != ctx.job_id
        ):
            super().update_state(task_id, state, meta, **kwargs)
            return
        ctx.showing(str(state), meta)

    def map(self, it: Iterable[Any]) -> group:  # type: ignore[override]
        """Celery's ``task.map(it)``: ``task(item)`` for each item, answered as a list. Each
        call is a run of its own in one workflow (a group through the journal), so each is
        kept and retried on its own; Celery's ``xmap`` runs them all inside one task."""
        return group([self.s(item) for item in it], app=self.app)

    def starmap(self, it: Iterable[Iterable[Any]]) -> group:  # type: ignore[override]
        """Celery's ``task.starmap(it)``: ``task(*item)`` for each item, as ``map``."""
        return group([self.s(*item) for item in it], app=self.app)

    def chunks(self, it: Iterable[Any], n: int) -> NoReturn:
        """Refused: a chunk's list is the answer of one task running several calls, and
        every call of a lifecycle task is a run of its own; ``starmap`` gives the same
        calls, answered as one flat list."""
        del it, n
        raise TypeError(
            f"{self.name}.chunks: every call of a lifecycle task is a run of its "
            "own, so there is no chunk to answer a list; use starmap (a group "
            "of the same calls)"
        )

    def enqueue_in(
        self,
        batch: enqueue.Batch,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        job_id: uuid.UUID | None = None,
    ) -> JobHandle:
        """Enqueue inside ``jobsapp.lifecycle.producer.enqueue.transaction``: written with the
        batch's other jobs (see ``enqueue.Batch``), published after it commits."""
        return batch.add(self.new_job(tuple(args), dict(kwargs or {}), job_id))

    # --- worker side ---------------------------------------------------------------

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: Any = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> NoReturn:
        """Celery's retry, kept in the journal: the same job, the next attempt, due after
        ``countdown`` seconds or at ``eta``, else after the class's own
        ``default_retry_delay`` if it declares one, else after the retry policy's backoff.
        ``max_retries`` bounds this call's retries as in Celery; once none is left the job
        fails with ``exc``, or with Celery's ``MaxRetriesExceededError`` when no ``exc``
        was given. A changed ``args``/``kwargs`` is refused: a retry runs the job's own
        arguments (they are the journal's row)."""
        if args is not None or kwargs is not None:
            # A mistake in the call, not a passing fault: the run fails, never retried.
            raise PermanentError(
                f"{self.name}.retry: args/kwargs cannot change on a retry: "
                "the next attempt runs the job's own arguments",
                error_code="retry_arguments",
            )
        if isinstance(exc, RetryRequested):
            # autoretry_for=(Exception,) caught the body's own self.retry(): Celery lets
            # its Retry through, so the body's countdown and max_retries stand.
            raise exc
        del throw, options
        if eta is not None:
            countdown = max(0.0, (maybe_make_aware(eta) - self.app.now()).total_seconds())
        elif countdown is None:
            countdown = _declared_retry_delay(type(self))
        raise RetryRequested(exc, countdown, max_retries)

    def replace(self, sig: Any) -> Any:
        """Celery's ``replace``: this job's answer becomes ``sig``'s (a task, a chain or a
        chord), written with this run's success in one transaction
        (lifecycle/workflows/replacement.py);
        the body ends here. Under ``apply()`` it runs ``sig`` here and returns its value, as
        Celery's does. What cannot be replaced is refused with one line (a ``TypeError``,
        never retried)."""
        if self.request.is_eager:
            return sig.apply().get()
        ctx = current_run_or_none()
        task = self.app.tasks.get(getattr(sig, "task", None) or "")
        why = replacement.refusal(sig, ctx)
        if why is None and sig.subtask_type is None and not isinstance(task, LifecycleTask):
            why = "the replacement must be a lifecycle task's signature"
        if why is not None or ctx is None:
            raise TypeError(f"{self.name}.replace: {why}")
        try:
            successor = replacement.hand_over(self.app, ctx, task, sig)
        except TypeError as refused:
            raise TypeError(f"{self.name}.replace: {refused}") from None
        raise Replaced(ctx.job_id, successor)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.request.called_directly:  # task(...): Celery's call, its request pushed
            return super().__call__(*args, **kwargs)
        eager = bool(self.request.is_eager)
        try:
            env, foreign = self._delivered(args, kwargs, eager)
        except InvalidMessage as bad:
            if eager:  # apply(): the caller hears it, as from a call that does not fit
                raise TypeError(f"{self.name}: {bad}") from None
            log.error("rejected message %s for %s: %s", self.request.id, self.name, bad)
            raise Logged(str(bad), requeue=False) from None
        with self._observed(env):
            if eager:
                return self._run_eagerly(env, foreign)
            ended = self._run_envelope(env, foreign)
        return _report(env, ended)

    def _delivered(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any], eager: bool
    ) -> tuple[message.Envelope, NewJob | None]:
        """The attempt a delivery asks for, and the row to insert if the journal has none."""
        if eager or not message.is_envelope(args, kwargs):
            request = self.request
            return newjob.adopted(
                self, str(request.id), request.get("traceparent"), args, kwargs, request.timelimit
            )
        env = message.parse(args, kwargs)
        if env.module != self.run_table.module:
            raise InvalidMessage(f"module {env.module!r} is not {self.run_table.module!r}")
        return env, newjob.foreign(self, env)

    def _run_eagerly(self, env: message.Envelope, foreign: NewJob | None) -> Any:
        """``apply()``: attempt after attempt here, through the journal, until the job
        ends (a pause between attempts is waited out). Returns what the body returned or
        raises what it raised, as Celery's eager call does; a job that was already taken
        (the same task id again) returns why it did not run."""
        ended = self._run_envelope(env, foreign, eager=True)
        while isinstance(ended, Ended) and ended.end is End.REQUEUED:
            env = replace(env, attempt=env.attempt + 1)
            ended = self._run_envelope(env, None, eager=True)
        if isinstance(ended, str):
            return ended
        if ended.end is End.SUCCEEDED:
            return ended.value
        if ended.error is not None:
            raise ended.error
        raise AttemptFailed(ended.summary)

    @contextmanager
    def _observed(self, env: message.Envelope) -> Iterator[None]:
        """The run's span (continuing the message's trace) and its log records' fields."""
        job: dict[str, str | int] = {
            "job_id": str(env.job_id),
            "attempt": env.attempt,
            "module": env.module,
            "task": self.name,
        }
        span = tracing.span(
            f"run {self.name}",
            {"traceparent": env.traceparent},
            consumer=True,
            attributes={f"jobsapp.{k}": v for k, v in job.items()},
        )
        with span, logs.about_job(**job):
            yield

    def _worker_name(self) -> str:
        return f"{self.request.hostname or socket.gethostname()}:{os.getpid()}"

    def _run_envelope(
        self, env: message.Envelope, foreign: NewJob | None, *, eager: bool = False
    ) -> Ended | str:
        worker, engine, settings = self._worker_name(), get_engine(), get_settings()
        rules = self._rules(settings, eager)
        wait_early = math.inf if eager else rules.inline_wait_max
        outcome = self._claim(engine, env, foreign, worker, wait_early, self._claim_gate())
        if isinstance(outcome, claim.Refusal):
            log.info("job %s attempt %s: no work, %s", env.job_id, env.attempt, outcome.value)
            return f"not run: {outcome.value}"
        if self.fair:
            key_limits.after_fair_claim(self.app, engine, self.run_table, outcome.row)
        self._show_call(env, outcome.row)
        interval = self.heartbeat_interval or settings.heartbeat_interval
        ctx = RunContext(
            engine=engine,
            spec=self.run_table,
            row=outcome.row,
            worker=worker,
            heartbeat=Heartbeat(
                engine,
                self.run_table,
                env.job_id,
                env.attempt,
                interval,
                settings.stale_after,
                token=outcome.row.claimed_token,
            ),
        )
        at_limit = None if eager else self._limited(ctx, rules)
        ended = run_attempt(self.app, ctx, lambda: self._call_body(outcome.row), rules)
        if at_limit is not None:
            ended = at_limit.instead_of(ended)
        if ended.end is End.LEASE_LOST:
            self._after_lost_lease(engine, env, ctx.token)
        return ended

    def _limited(self, ctx: RunContext, rules: AttemptRules) -> timeouts.AtLimit | None:
        """The journal's end of this attempt at its hard time limit, if it has one: the
        only limit under the threads and solo pools (lifecycle/worker/timeouts.py)."""
        seconds = timeouts.hard_limit(self.request.timelimit, self.time_limit, self.app)
        if seconds is None:
            return None
        at_limit = timeouts.AtLimit(self.app, ctx, rules, seconds)
        ctx.heartbeat.limit(seconds, at_limit)
        return at_limit

    def _after_lost_lease(self, engine: Engine, env: message.Envelope, token: uuid.UUID) -> None:
        """Name a claim lost in a database crash (it did not wait for the flush). A run
        still queued before this attempt: hand the message back so that it is claimed again
        now, rather than after the relay's unclaimed check. Claimed again by another
        worker: that claim alone holds the run; this message is done. Either way the body
        ran and may run again, as after a worker crash mid-run."""
        try:
            with engine.connect() as conn:
                row = journal.load(conn, self.run_table, env.job_id)
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
        self,
        engine: Engine,
        env: message.Envelope,
        foreign: NewJob | None,
        worker: str,
        wait_early: float,
        gate: gating.Gate | None,
    ) -> claim.Claimed | claim.Refusal:
        try:
            return claim.claim(
                engine,
                self.run_table,
                env,
                foreign=foreign,
                worker=worker,
                wait_early=wait_early,
                gate=gate,
            )
        except InvalidMessage as bad:
            log.error("rejected message %s for %s: %s", self.request.id, self.name, bad)
            raise Logged(str(bad), requeue=False) from None
        except OperationalError as down:
            # The journal is unreachable: hand the message back rather than ack it unrun.
            log.warning(
                "claim of job %s failed, requeueing the message: %s",
                env.job_id,
                type(down.orig).__name__,
            )
            time.sleep(1.0)
            raise Logged("journal unavailable", requeue=True) from None

    @property
    def _gate(self) -> gating.Gate:
        """What flow control checks before a run of this task starts."""
        return self._gate_of(claim.claim_holds(self.app))

    def _claim_gate(self) -> gating.Gate | None:
        """The gate of this task's claims; None (a claim of one statement that enters no
        flow code) for a task with no rate on an app with no claim hold."""
        holds = claim.claim_holds(self.app)
        return self._gate_of(holds) if holds or self.rate is not None else None

    def _gate_of(self, holds: tuple[gating.Hold, ...]) -> gating.Gate:
        """The gate, built once per task and set of holds (a hold registered later gives
        its app a new tuple)."""
        kept: gating.Gate | None = self.__dict__.get("_kept_gate")
        if kept is None or kept.holds is not holds:
            rate = gating.parse_rate(self.rate) if self.rate else None
            queue = str(self.app.conf.task_default_queue)
            kept = self.__dict__["_kept_gate"] = gating.Gate(
                self.name, queue, rate, self._rate_key_of, holds
            )
        return kept

    def _rate_key_of(self, row: Run) -> str:
        if self.rate_key is None:
            return ""
        args, kwargs = self._call_of(row)
        values = newjob.named(self, args, kwargs)
        return self.rate_key.format(**{"concurrency_key": row.concurrency_key, **values})

    def _rules(self, settings: Settings, eager: bool) -> AttemptRules:
        """``attempt_rules`` for a worker's (or, ``eager``, an ``apply()``'s) attempts,
        built once per task and settings: none of it changes from job to job."""
        kept = self.__dict__.get("_kept_rules")
        if kept is None or kept[0] is not settings:
            rules = self.attempt_rules(settings.inline_wait_max)
            kept = self.__dict__["_kept_rules"] = (
                settings,
                {False: rules, True: replace(rules, publish_retry=False)},
            )
        rules_of: dict[bool, AttemptRules] = kept[1]
        return rules_of[eager]

    def attempt_rules(self, inline_wait_max: float) -> AttemptRules:
        """How an attempt's end is settled: the retry policy and its options."""
        return AttemptRules(
            policy=self.retry_policy,
            permanent=self.permanent_errors,
            inline_wait_max=self.inline_wait_max or inline_wait_max,
            secrets=_process_secrets(),
            max_snoozes=self.max_snoozes,
            requested_only=bool(getattr(self, "autoretry_for", ())),
        )

    def _call_of(self, run: Run) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The body's arguments, read from the run table's own columns."""
        spec = self.run_table
        if spec.params_column is None:
            return (), spec.ids_from_row(run.columns)
        params = decoded(run.columns[spec.params_column] or {})
        return tuple(params.get("args", ())), dict(params.get("kwargs", {}))

    def _call_body(self, row: Run) -> Any:
        """The body, its ``self.request`` the caller's view as in Celery: the job's task
        id, the body's own arguments, ``retries`` the attempts before this one."""
        args, kwargs = self._call_of(row)
        if errback.MARK in kwargs:
            args, kwargs = errback.arguments(self.app, args, kwargs)
        job = str(row.job_id)
        # Celery's push_request copies the current request's fields under these.
        self.push_request(
            id=job,
            args=list(args),
            kwargs=kwargs,
            retries=row.attempts - 1,
            root_id=self.request.root_id or job,
        )
        try:
            return self.run(*args, **kwargs)
        finally:
            self.pop_request()

    def _show_call(self, env: message.Envelope, row: Run) -> None:
        """Flower's args and kwargs of this attempt: the body's, and the job it belongs to
        (see ``celery_view``); only when the worker sends task events."""
        if not self.request.get(EVENTS_ON):
            return
        args, kwargs = self._call_of(row)
        shown = call_fields(args, kwargs, _process_secrets())
        try:
            send_started(
                self.app,
                str(self.request.id),
                str(self.request.hostname),
                {**shown, "job_id": str(env.job_id), "attempt": env.attempt},
            )
        except publisher.BROKER_ERRORS as down:  # a live view; the attempt goes on
            log.info("task event of job %s not sent: %s", env.job_id, type(down).__name__)


def _declared_retry_delay(cls: type[LifecycleTask]) -> float | None:
    """Celery's ``default_retry_delay`` where the task declares it; Celery's own default
    (180 s) gives way to the retry policy's backoff (docs/lifecycle.md)."""
    for klass in cls.__mro__:
        if klass is LifecycleTask:
            return None
        if "default_retry_delay" in klass.__dict__:
            delay = klass.__dict__["default_retry_delay"]
            return None if delay is None else float(delay)
    return None


# The frame that calls the body: Flower's traceback of a failed attempt starts below it.
_BODY_CALL = LifecycleTask._call_body.__code__


def _report(env: message.Envelope, ended: Ended | str) -> Any:
    """The attempt's Celery result or exception (``celery_view.report``), its traceback
    starting below the body's call."""
    return report(env, ended, entry=_BODY_CALL, secrets=_process_secrets())
