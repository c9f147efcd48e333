"""Exceptions a task body raises to steer its run, and the ones the engine raises."""

from __future__ import annotations

import uuid

from celery.exceptions import Reject
from kombu.exceptions import EncodeError


class PermanentError(Exception):
    """Retrying cannot help (bad input, unsupported data): the run ends ``failed``.

    ``error_code`` is a short machine-readable reason kept for operators.
    """

    error_code = "permanent"

    def __init__(self, message: str, *, error_code: str | None = None) -> None:
        super().__init__(message)
        if error_code is not None:
            self.error_code = error_code


class TransientError(Exception):
    """Worth another attempt later (a service down, a timeout)."""


class RetryAfter(Exception):
    """The body was told to come back later (an HTTP ``Retry-After``, a rate limit).

    A short pause is waited out inside the task; a long one returns the job to ``queued``
    with ``next_retry_at`` and frees the worker slot, without spending an attempt.
    """

    def __init__(self, seconds: float, reason: str = "") -> None:
        super().__init__(reason or f"retry after {seconds:g}s")
        self.seconds = max(0.0, float(seconds))


class LeaseLost(Exception):
    """The run's row moved on without this worker (reaped or replayed): publish nothing."""


class CancelRequested(LeaseLost):
    """A revoke or an operator asked the running attempt to stop (``app.control.revoke``):
    raised in the body at the heartbeat's next beat, and by ``check_lease()``."""

    def __init__(self, message: str = "a revoke asked this attempt to stop") -> None:
        super().__init__(message)


class TimeLimitEnded(LeaseLost):
    """The journal ended the running attempt at its hard time limit (recorded with
    Celery's ``TimeLimitExceeded``): raised in the body at the heartbeat's beat, as
    ``CancelRequested`` is (lifecycle/worker/timeouts.py)."""

    def __init__(self, message: str = "the journal ended this attempt at its time limit") -> None:
        super().__init__(message)


class Logged(Reject):
    """Celery's ``Reject`` of a message whose refusal (or hand-back) jobsapp has logged in its
    own line: Celery's line about the same reject is dropped (``logs.one_line_per_reject``),
    so a refusal is one line, as docs/messages.md says."""


class InvalidMessage(Exception):
    """A broker message that violates ``jobs.schema.json``: rejected, never retried."""


class RetryRequested(TransientError):
    """Celery's ``self.retry()`` (and ``autoretry_for``) inside a lifecycle task."""

    def __init__(
        self,
        cause: BaseException | None,
        countdown: float | None,
        max_retries: int | None = None,
    ) -> None:
        super().__init__(str(cause) if cause else "retry requested")
        self.cause = cause
        self.countdown = countdown
        # The call's own ``max_retries`` (Celery's ``self.retry(max_retries=...)``).
        self.max_retries = max_retries


class DatabaseNotMigrated(Exception):
    """The journal's tables are missing, or behind this code, where a producer enqueues.

    Its message is the line every jobsapp process prints at start for the same database:
    ``database not migrated: JOBSAPP_DATABASE_URL=...: ...; run `jobsapp db upgrade```.
    """


class DatabaseNotPermitted(Exception):
    """The database role may not use the journal's tables (an application role the
    tables' owner granted nothing yet), where a producer enqueues or a result is read.

    Its message is the line a worker prints at start for the same database, naming the
    ``GRANT`` statements to run.
    """


class ArgumentRefused(TypeError, EncodeError):
    """An argument Celery's JSON serializer cannot carry, refused at the call before anything
    is written: kombu's ``EncodeError``, as Celery's ``delay()`` raises it, and a
    ``TypeError``, as a call that does not fit raises."""


class ResultRefused(PermanentError, EncodeError):
    """The body returned what its run cannot keep: not JSON (``result_not_json``) or over
    ``JOBSAPP_RESULT_MAX_BYTES`` (``result_too_large``). The body's work is done; running
    it again would return the same, so the run fails without a retry. It is kombu's
    ``EncodeError``, as Celery's worker fails a task whose result it cannot encode."""


class Replaced(Exception):
    """Raised by ``Task.replace`` once the hand-over committed (lifecycle/replace.py): the
    body ends here; its run already succeeded, naming the job that answers for it."""

    def __init__(self, job_id: uuid.UUID, successor: uuid.UUID) -> None:
        super().__init__(f"job {job_id} replaced by job {successor}")
        self.successor = successor
