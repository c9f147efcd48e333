"""``LifecycleTask``: a Celery task whose every run lives in the journal.

The class is Celery's Task API surface, each method a thin door to the floor that owns it:
``apply_async``/``delay`` enqueue through the journal and return a ``JobHandle``
(producer/applied.py; with ``link``/``link_error``, a workflow: workflows/canvas.py);
``__call__`` (what the worker runs) is worker/delivery.py's path of one delivery: the
message, the claim, the attempt. A plain Celery call of the task (``send_task`` by name,
``apply()``) becomes a run of its own, keyed by its Celery task id. Idiomatic
``self.retry()`` and ``autoretry_for`` map to the same journal semantics.

What a call hands the journal (the job id, the row's values, the argument checks, the
concurrency key) is built in ``producer/newjob``, and what Celery and Flower show of an
attempt's end in ``worker/celery_view``.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from functools import cached_property
from typing import Any, ClassVar, NoReturn

from celery import Celery, Task, group
from celery._state import get_current_worker_task
from celery.result import EagerResult
from kombu import Queue
from sqlalchemy import Connection
from sqlalchemy.orm import Session

from jobsapp.lifecycle.celery_api import group_handles, task_hooks
from jobsapp.lifecycle.celery_api.backend import JournalBackend
from jobsapp.lifecycle.celery_api.backend import for_app as backend_for
from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.flow import gating
from jobsapp.lifecycle.journal import EnqueueOutcome, NewJob, registry
from jobsapp.lifecycle.producer import applied, enqueue, newjob
from jobsapp.lifecycle.rules import message
from jobsapp.lifecycle.rules.retry import RetryPolicy
from jobsapp.lifecycle.transport import hooks
from jobsapp.lifecycle.worker import claim, delivery
from jobsapp.lifecycle.worker.attempt import AttemptRules
from jobsapp.lifecycle.worker.celery_view import AttemptFailed
from jobsapp.lifecycle.worker.context import current_run_or_none
from jobsapp.lifecycle.workflows import canvas, replacement


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
    ignore_result = True
    # An attempt's failure is journalled and logged by jobsapp: Celery logs it briefly.
    throws = (AttemptFailed,)
    Request = "jobsapp.lifecycle.worker.celery_view:LifecycleRequest"
    # Set per class: hooks of a team's own, and its __call__ around the body (task_hooks).
    hooked: ClassVar[bool] = False
    around_body: ClassVar[Callable[..., Any] | None] = None
    # Set per class: the class names its calls itself (its own ``shadow_name``).
    names_calls: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Celery's max_retries counts retries; the journal counts attempts.
        if "max_retries" in cls.__dict__ and "max_attempts" not in cls.__dict__:
            retries = cls.__dict__["max_retries"]
            cls.max_attempts = 1_000_000 if retries is None else int(retries) + 1
        # A wrong limit is refused where the task is declared, not at its first enqueue.
        name = str(cls.__dict__.get("name", cls.__qualname__))
        newjob.key_limit_of(name, cls.limit, cls.fair, cls.fair_window)
        gating.check_declared(cls)
        # A team's hooks and __call__ (its own base's, task_hooks): found once per class.
        cls.hooked = task_hooks.wrap_hooks(cls)
        around = task_hooks.body_call(cls, LifecycleTask)
        cls.around_body = None if around is None else staticmethod(around)
        # Celery asks every call without a shadow for one; a class that does not override
        # the hook (which names none) makes its calls pay nothing for asking.
        cls.names_calls = cls.shadow_name is not Task.shadow_name

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        """Celery's hook when a task joins its app (the app's setup, never an import): from
        then on, Celery's chain, group and chord of lifecycle tasks go through the journal
        (``canvas.install``), the app's fast path leaves a paused queue's messages to the
        relay, and its workers' claims hold them (an operator may pause any queue, so every
        app with a lifecycle task honours it on publish and on claim)."""
        super().on_bound(app)
        LifecycleTask.joined(app)

    @staticmethod
    def joined(app: Celery) -> None:
        """``on_bound``'s registrations, each idempotent (a team base's own ``on_bound``
        that calls no ``super()`` still gets them: task_hooks)."""
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

    @property
    def checks_call(self) -> bool:
        """Celery's ``typing``: a call that does not fit the body is refused at the call.
        Declared ``typing=False`` (or an app's ``strict_typing=False``), it is enqueued as
        given and fails in the worker, as Celery's does, unless the task's key or rate
        key needs the arguments by name."""
        return bool(self.typing) or self.key is not None or self.rate_key is not None

    @cached_property
    def _signature(self) -> inspect.Signature:
        """``run``'s signature, read once per task (inspect takes longer than the bind)."""
        return inspect.signature(self.run)

    def row_values(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The run row's own columns (override to write a domain's ids differently)."""
        return newjob.row_values(self.run_table, self.name, args, kwargs)

    def new_job(
        self,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        job_id: uuid.UUID | None,
        lineage: newjob.GivenLineage | None = None,
    ) -> NewJob:
        """The run a call of this task writes (see ``newjob``)."""
        return newjob.build(self, args, kwargs, job_id, by_caller=True, lineage=lineage)

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
        queue: str | Queue | None = None,
        priority: int | None = None,
        expires: float | datetime | None = None,
        time_limit: float | None = None,
        soft_time_limit: float | None = None,
        shadow: str | None = None,
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
        message of the job carries them, and the call's ``shadow``: the name logs, events
        and Flower show for it, its task and result staying this one). ``link``/``link_error``
        make the call a workflow (lifecycle/workflows/canvas.py). ``headers`` are kept
        on the run for every attempt's ``self.request``, and so are ``root_id`` and
        ``parent_id`` (Celery's tracer names them sending a ``link``). Called from a task's
        body, the call's result is among the task's ``children`` unless ``add_to_parent``
        is False, as in Celery. ``compression``, ``ignore_result`` and ``serializer='json'``
        change nothing a job keeps, and so do ``retry`` and ``retry_policy`` (the outbox
        publishes every message until the broker takes it), Celery's ``producer`` and a kombu
        ``connection`` (the message goes through jobsapp's publisher after COMMIT); other
        Celery options are refused with what to do instead.
        Under ``task_always_eager`` it is ``apply()``, as in Celery: the job runs here.
        """
        callbacks = {o: options.pop(o) for o in ("link", "link_error") if options.get(o)}
        if not shadow and self.names_calls:
            given = {
                "job_id": job_id,
                "session": session,
                "connection": connection,
                "countdown": countdown,
                "eta": eta,
                "headers": headers,
                "queue": queue,
                "priority": priority,
                "expires": expires,
                "time_limit": time_limit,
                "soft_time_limit": soft_time_limit,
            }
            shadow = self._shadow_of(args, kwargs, given, options)
        lineage = None
        if options:  # the plain call pays nothing for the check
            lineage = applied.given_lineage(options)
            applied.refuse(self.name, applied.unsupported(options))
        if connection is not None and not isinstance(connection, Connection):
            connection = applied.journal_connection(self.name, connection)
        schedule = {
            "countdown": countdown,
            "eta": eta,
            "headers": headers,
            "expires": expires,
            "time_limit": time_limit,
            "soft_time_limit": soft_time_limit,
            "shadow": shadow,
        }
        if callbacks and not self.app.conf.task_always_eager:
            due = {"countdown": countdown, "eta": eta}
            kept = {**due, "shadow": shadow}
            others = {"job_id": job_id, "session": session, "connection": connection, **schedule}
            refused = {k for k, v in others.items() if v and k not in kept}
            applied.refuse(f"{self.name} with link/link_error", refused)
            step = {"task_id": task_id, "queue": queue, "priority": priority, "shadow": shadow}
            # The workflow's first step descends from the root and parent the call names.
            descends = dict(zip(("root_id", "parent_id"), lineage or (), strict=False))
            when = {k: v for k, v in {**due, **descends}.items() if v is not None}
            handle = self._with_callbacks(args, kwargs, step, {**callbacks, **when})
            return group_handles.trailed(handle, options.get("add_to_parent", True))
        if self.app.conf.task_always_eager:
            wanted = job_id or task_id
            return self.apply(
                tuple(args or ()), dict(kwargs or {}), task_id=str(wanted) if wanted else None
            )
        job = self.new_job(
            tuple(args or ()),
            dict(kwargs or {}),
            newjob.job_id_of(self.name, job_id, task_id),
            lineage,
        )
        named = str(task_id) if task_id and not job_id else None
        if expires is None:
            # The task's own expiry, as Celery gives every call (its messages carry it: the
            # journal must end the job, or a message a worker discards leaves it queued).
            schedule["expires"] = self.expires
        handle = applied.enqueued(
            self.app,
            job,
            task_id=named,
            session=session,
            connection=connection,
            queue=queue,
            priority=priority,
            **schedule,
        )
        # Celery's send_task: a call from a task's body is among its children, from the
        # enqueue on, whoever publishes it later (the outbox does not trail it again). Not
        # through ``group_handles.trailed``: a call from outside a task pays no call more.
        parent = get_current_worker_task()
        if parent is not None and options.get("add_to_parent", True):
            parent.add_trail(handle)
        return handle

    def _shadow_of(
        self,
        args: tuple[Any, ...] | list[Any] | None,
        kwargs: Mapping[str, Any] | None,
        named: Mapping[str, Any],
        options: Mapping[str, Any],
    ) -> str | None:
        """The name the task's ``shadow_name`` gives a call, asked as Celery's
        ``apply_async`` asks it: the call's arguments as given and its options but
        ``task_id``, ``link``, ``link_error`` and ``shadow`` (those it was given by name)."""
        given = {k: v for k, v in named.items() if v is not None}
        # Celery's stubs type the default hook, which names nothing.
        hook: Callable[..., str | None] = self.shadow_name
        return hook(args, kwargs, {**given, **options})

    def _with_callbacks(
        self,
        args: tuple[Any, ...] | list[Any] | None,
        kwargs: Mapping[str, Any] | None,
        step: Mapping[str, Any],
        callbacks: Mapping[str, Any],
    ) -> JobHandle:
        """A call with ``link``/``link_error``: a workflow of this step and its callbacks
        (lifecycle/workflows/canvas.py); ``step`` holds the options a step keeps,
        ``callbacks`` the canvas's own (its callbacks, and when the step is due)."""
        sig = self.s(*(args or ()), **(kwargs or {}))
        sig.set(**{k: v for k, v in step.items() if v is not None})
        # apply_async asked the task's shadow_name for this call; Celery asks it once.
        handle: JobHandle = canvas.start(sig, None, callbacks, asked=True)
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
        del throw, options
        raise delivery.retry_requested(self, args, kwargs, exc, eta, countdown, max_retries)

    def replace(self, sig: Any) -> Any:
        """Celery's ``replace``: this job's answer becomes ``sig``'s (a task, a chain or a
        chord), written with this run's success in one transaction
        (lifecycle/workflows/replacement.py);
        the body ends here. Under ``apply()`` it runs ``sig`` here and returns its value, as
        Celery's does. What cannot be replaced is refused with one line (a ``TypeError``,
        never retried)."""
        if self.request.is_eager:
            return sig.apply().get()
        task = self.app.tasks.get(getattr(sig, "task", None) or "")
        lifecycle = task if isinstance(task, LifecycleTask) else None
        return replacement.replace(self.app, self.name, sig, lifecycle)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        around = self.around_body
        if around is not None and request.get(task_hooks.IN_BODY):
            # A team's __call__ around the body calling super().__call__(): the body runs.
            return super().__call__(*args, **kwargs)
        if request.called_directly:  # task(...): Celery's call, its request pushed
            if around is None:
                return super().__call__(*args, **kwargs)
            self.push_request(**{task_hooks.IN_BODY: True})  # the team's __call__ first
            try:
                return around(self, *args, **kwargs)
            finally:
                self.pop_request()
        return delivery.deliver(self, request, args, kwargs)

    def attempt_rules(self, inline_wait_max: float) -> AttemptRules:
        """How an attempt's end is settled: the retry policy and its options."""
        return AttemptRules(
            policy=self.retry_policy,
            permanent=self.permanent_errors,
            inline_wait_max=self.inline_wait_max or inline_wait_max,
            secrets=delivery.process_secrets(),
            max_snoozes=self.max_snoozes,
            requested_only=bool(getattr(self, "autoretry_for", ())),
        )
