"""What a running body may know about its run, and how it commits its result."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine

from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import Run, key_slots
from jobsapp.lifecycle.journal.registry import RunTable
from jobsapp.lifecycle.rules import results
from jobsapp.lifecycle.rules.errors import LeaseLost
from jobsapp.lifecycle.rules.failures import describe, failure_detail
from jobsapp.lifecycle.rules.scrub import known_secrets_from_env
from jobsapp.lifecycle.rules.states import Outcome
from jobsapp.lifecycle.worker import key_limits
from jobsapp.lifecycle.worker.heartbeat import Heartbeat
from jobsapp.settings import get_settings


@dataclass
class RunContext:
    engine: Engine
    spec: RunTable
    # The run as its claim returned it.
    row: Run
    worker: str
    heartbeat: Heartbeat
    finished: bool = field(default=False)
    # The exception the body ended its run failed with (``failing``): Celery's and
    # Flower's FAILURE of this attempt.
    failed_with: BaseException | None = field(default=None)
    # The runs this attempt's outcome gave its key's slot (a limited key), to publish.
    granted: key_slots.Granted = field(default=key_slots.Granted())
    # A canvas step whose body ended its chain (``self.request.chain = None``): its
    # success starts none of the chain's later steps (journal/workflow.py).
    chain_ended: bool = field(default=False)
    # The results of the calls the body made (Celery's ``request.children``, None while it
    # made none), read off its request as it is popped: its success keeps them.
    children: list[Any] | None = field(default=None)
    # The results of the callbacks Celery's tracer sends after this attempt's success (a
    # plain call's ``link``, named before the body runs): Celery's request trails them
    # after the body's calls, so the success keeps them after its children.
    callbacks: list[Any] | None = field(default=None)
    _entered: Token[RunContext | None] | None = field(default=None, init=False, repr=False)

    def __enter__(self) -> RunContext:
        """While entered (the attempt), the body's code sees this run as ``current_run()``."""
        self._entered = _current.set(self)
        return self

    def __exit__(self, *_exc: object) -> None:
        assert self._entered is not None, "exited a run never entered"
        _current.reset(self._entered)
        self._entered = None

    @property
    def job_id(self) -> uuid.UUID:
        return self.row.job_id

    @property
    def attempt(self) -> int:
        return self.row.attempts

    @property
    def token(self) -> uuid.UUID:
        """The claim's token: with ``attempt``, the fence of every write of this run."""
        return self.row.claimed_token

    @property
    def cancel_requested(self) -> bool:
        """Whether a revoke (or an operator's cancel) asked this attempt to stop, as of the
        heartbeat's last beat; the next beat raises CancelRequested in the body anyway."""
        return self.heartbeat.cancelled

    def check_lease(self) -> None:
        """Raise LeaseLost before publishing effects if the run was taken from us."""
        self.heartbeat.check()

    @contextmanager
    def completing(self, result: Any = None) -> Iterator[Connection]:
        """A transaction that commits the body's writes together with ``succeeded``, and
        ``result`` as the run's result (the body's return value is not kept: the run
        succeeded before the body returned).

        The fenced finish runs first: if the lease is lost nothing the body writes in
        this transaction lands.
        """
        kept = results.checked(self.row.task_name, result, get_settings().result_max_bytes)
        with self.engine.begin() as conn:
            if not journal.succeed(
                conn,
                self.spec,
                self.job_id,
                self.attempt,
                token=self.token,
                actor=self.worker,
                result=kept,
            ):
                raise LeaseLost(f"job {self.job_id} attempt {self.attempt}: finish refused")
            # A limited key's slot goes with the success, in this transaction.
            _, self.granted = key_limits.let_go(conn, self.spec, self.row, True)
            yield conn
        self.finished = True

    def showing(self, state: str, meta: Any) -> None:
        """Celery's ``update_state`` of this attempt: ``state`` and ``meta`` kept on the run
        (fenced by its claim) for ``AsyncResult.state``/``.info`` while it runs; the
        attempt's end replaces them."""
        kept = results.checked(self.row.task_name, meta, get_settings().result_max_bytes)
        with self.engine.begin() as conn:
            if not journal.write_progress(
                conn,
                self.spec,
                self.job_id,
                self.attempt,
                self.token,
                results.progress(state, kept, self.attempt),
            ):
                raise LeaseLost(f"job {self.job_id} attempt {self.attempt}: update_state refused")

    @contextmanager
    def failing(
        self,
        error: BaseException,
        *,
        outcome: Outcome = Outcome.PERMANENT,
        said: str | None = None,
    ) -> Iterator[Connection]:
        """A transaction that commits the body's writes together with ``failed`` (no
        further attempt), ``error`` stored as the attempt's failure: the body ends its run
        failed, and Celery and Flower show FAILURE with ``error``. Fenced first, as
        ``completing``: if the lease is lost nothing the body writes here lands.
        The body returns normally afterwards; what it returns is not kept. ``said`` is the
        run's ``last_error`` when the exception's own description is not what to show."""
        secrets = known_secrets_from_env(os.environ)
        said, detail = said or describe(error, secrets), failure_detail(error, secrets)
        with self.engine.begin() as conn:
            failed = journal.fail(
                conn,
                self.spec,
                self.job_id,
                self.attempt,
                token=self.token,
                outcome=outcome,
                error=said,
                actor=self.worker,
                detail=detail,
            )
            if not failed:
                raise LeaseLost(f"job {self.job_id} attempt {self.attempt}: failure refused")
            _, self.granted = key_limits.let_go(conn, self.spec, self.row, True)
            yield conn
        self.finished = True
        self.failed_with = error


_current: ContextVar[RunContext | None] = ContextVar("jobsapp_run", default=None)


def current_run() -> RunContext:
    """The run the calling task body belongs to."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("current_run() called outside a lifecycle task body")
    return ctx


def current_run_or_none() -> RunContext | None:
    """The run the calling code belongs to, None outside a lifecycle task body."""
    return _current.get()
