"""``Run``: one run row as the journal read it, the columns every run table shares typed.

Built once from the row the statement returned (``Run.from_row``: keyword arguments, no
loop, so a claim pays two Python calls for it); the run table's own columns (a generic
job's ``params``, a domain's ids and progress columns) are read from ``columns``, the row
itself. The fields are tables.RunMixin's columns (tests/unit/test_run_row.py holds them
in step).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any, Protocol

from jobsapp.lifecycle.rules.results import decoded

# A body's positional and keyword arguments, and the call's own headers (a plain tuple:
# a NamedTuple's constructor is one more Python call a delivery).
Call = tuple[tuple[Any, ...], dict[str, Any], dict[str, Any] | None]


class CallColumns(Protocol):
    """Where a run table keeps a call (a RunTable): a generic job's ``params``, or ids."""

    @property
    def params_column(self) -> str | None: ...

    def ids_from_row(self, row: Mapping[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Run:
    job_id: uuid.UUID
    task_name: str
    concurrency_key: str
    state: str
    outcome: str | None
    attempts: int
    max_attempts: int
    rescues: int
    heartbeat_at: datetime | None
    last_error: str | None
    next_retry_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    worker: str | None
    claim_token: uuid.UUID | None
    queue: str | None
    result: Any
    expires_at: datetime | None
    cancel_requested_at: datetime | None
    workflow_id: uuid.UUID | None
    key_limit: int | None
    enqueued_by: str | None
    attempted_at: datetime | None
    priority: int | None
    time_limit: float | None
    soft_time_limit: float | None
    # Every column as read, the run table's own included (RunTable.id_columns,
    # params_column, a domain's progress columns).
    columns: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Run:
        return cls(
            job_id=row["job_id"],
            task_name=row["task_name"],
            concurrency_key=row["concurrency_key"],
            state=row["state"],
            outcome=row["outcome"],
            attempts=row["attempts"],
            max_attempts=row["max_attempts"],
            rescues=row["rescues"],
            heartbeat_at=row["heartbeat_at"],
            last_error=row["last_error"],
            next_retry_at=row["next_retry_at"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            updated_at=row["updated_at"],
            worker=row["worker"],
            claim_token=row["claim_token"],
            queue=row["queue"],
            result=row["result"],
            expires_at=row["expires_at"],
            cancel_requested_at=row["cancel_requested_at"],
            workflow_id=row["workflow_id"],
            key_limit=row["key_limit"],
            enqueued_by=row["enqueued_by"],
            attempted_at=row["attempted_at"],
            priority=row["priority"],
            time_limit=row["time_limit"],
            soft_time_limit=row["soft_time_limit"],
            columns=row,
        )

    @property
    def claimed_token(self) -> uuid.UUID:
        """The token of the claim that returned this row (every claim writes one): the
        fence, with ``attempts``, of each write of its attempt."""
        if self.claim_token is None:
            raise ValueError(f"run {self.job_id} was never claimed")
        return self.claim_token

    @classmethod
    def maybe(cls, row: Mapping[str, Any] | None) -> Run | None:
        return None if row is None else cls.from_row(row)

    def call(self, spec: CallColumns) -> Call:
        """The body's arguments as the run keeps them, read from the run table's own
        columns: a generic job's (with its call's headers), a domain run's ids as keyword
        arguments."""
        column = spec.params_column
        if column is None:
            return (), spec.ids_from_row(self.columns), None
        params = decoded(self.columns[column] or {})
        return tuple(params.get("args", ())), dict(params.get("kwargs", {})), params.get("headers")


@dataclass(frozen=True, slots=True)
class EndedAttempt:
    """What an end of an attempt reads back of its run (the reap's RETURNING, a finish's
    parts on SQLite): the claim the row carried and the workflow the run is a step of."""

    job_id: uuid.UUID
    attempts: int
    attempted_at: datetime | None
    worker: str | None
    workflow_id: uuid.UUID | None

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> EndedAttempt:
        return cls(
            row["job_id"], row["attempts"], row["attempted_at"], row["worker"], row["workflow_id"]
        )


@dataclass(frozen=True, slots=True)
class RecordedFailure:
    """The failure detail an attempt's event recorded (rules/failures.py ``failure_detail``):
    the exception's qualified type, its scrubbed message and innermost frames, and its
    arguments when they are plain text and numbers (None: they were not)."""

    type: str
    message: str | None
    traceback: str | None
    args: list[Any] | None

    @classmethod
    def of(cls, detail: Mapping[str, Any]) -> RecordedFailure:
        given, shown = detail.get("args"), detail.get("traceback")
        return cls(
            str(detail.get("type", "")),
            detail.get("message"),
            shown if isinstance(shown, str) else None,
            given if isinstance(given, list) else None,
        )


class CarriedClaim(Protocol):
    """A run row's claim (``Run`` and ``EndedAttempt`` carry one): the attempt, its worker,
    and ``attempted_at``, None once the claim has an event row of its own."""

    @property
    def job_id(self) -> uuid.UUID: ...

    @property
    def attempts(self) -> int: ...

    @property
    def attempted_at(self) -> datetime | None: ...

    @property
    def worker(self) -> str | None: ...


@cache
def worker_of(hostname: str | None, pid: int) -> str:
    """The ``worker`` a worker process writes on the runs it claims (and on the failed run of
    a task it has not registered: transport/guard.py), made once per process (a forked
    pool child has a pid, so a name, of its own)."""
    return f"{hostname or socket.gethostname()}:{pid}"
