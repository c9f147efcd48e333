"""Run tables known to the engine, the reaper, the relay and the admin summary.

A domain registers its table once; monitoring and maintenance then work over every run
table in its own home, without a central table of all jobs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Table

from jobsapp.lifecycle.journal.tables import JobRun
from jobsapp.settings import get_settings

if TYPE_CHECKING:
    from jobsapp.lifecycle.rules.states import Transition

# Called in the transaction of a transition made outside the task body (reaper, operator,
# rerun) with the changed runs (job_id plus id columns), so a domain keeps rows that
# mirror the run (an attachment's client-visible state) in step with it.
ChangeHook = Callable[[Connection, "Transition", Sequence[Mapping[str, Any]]], None]


class StalePolicy(StrEnum):
    """What the reaper does with a run whose heartbeat went stale."""

    REQUEUE = "requeue"
    FAIL = "fail"


@dataclass(frozen=True)
class ReconcilePolicy:
    """Which failed runs of a domain its reconcile pass takes again, and how gently.

    A failure carries a code when the code is a whole word of its ``last_error`` (an
    ``error_code`` such as ``storage_unavailable`` or an exception class such as
    ``TransientError``). A code in ``never`` keeps a run failed whatever else it says.
    """

    retake: frozenset[str]
    never: frozenset[str] = frozenset()
    # Since the failure: an outage should be over before its victims are taken again.
    cool_down: timedelta = timedelta(minutes=15)
    # Reconcile replays of one job, over its whole life; then it stays failed for a human.
    max_rounds: int = 3
    # Jobs taken again per domain and pass.
    batch: int = 100

    def __post_init__(self) -> None:
        if self.retake & self.never:
            raise ValueError(f"codes both retaken and never: {sorted(self.retake & self.never)}")
        if self.max_rounds < 1 or self.batch < 1 or self.cool_down < timedelta(0):
            raise ValueError("reconcile needs positive rounds and batch, a cool-down >= 0")


@dataclass(frozen=True)
class RunTable:
    module: str
    table: Table
    stale_policy: StalePolicy
    # Domain columns that travel in the message (ids only) and identify the run's subject.
    id_columns: tuple[str, ...] = ()
    # A JSON column holding a generic task's arguments, which never travel in the message.
    params_column: str | None = None
    # How often the reaper may rescue one job before it fails it as a poison job.
    rescue_limit: int = 3
    on_change: ChangeHook | None = None
    # None: the domain's failures wait for an operator's replay.
    reconcile: ReconcilePolicy | None = None

    def requeues_stale(self, attempt: int, max_attempts: int, rescues: int) -> bool:
        """Whether the reaper gives a stale run of ``attempt`` another attempt: the policy
        says so, with attempts and rescues to spare. Also whether a success a database
        crash lost, its run back to running under its claim, runs again
        (lifecycle/worker/attempt.py)."""
        return (
            self.stale_policy is StalePolicy.REQUEUE
            and attempt < max_attempts
            and rescues < self.rescue_limit
        )

    def ids_from_row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        return {c: row[c] for c in self.id_columns}

    def changed(
        self, conn: Connection, transition: Transition, runs: Sequence[Mapping[str, Any]]
    ) -> None:
        if self.on_change is not None and runs:
            self.on_change(conn, transition, runs)


_REGISTRY: dict[str, RunTable] = {}
# The modules that register jobsapp's own run tables. A deployment's domains are named in
# JOBSAPP_IMPORTS with its tasks (docs/domains.md).
DOMAIN_MODULES = ("jobsapp.attachments.models",)
_loaded = False


def register(spec: RunTable) -> RunTable:
    """Make ``spec`` known; registering the same module twice must be the same table."""
    known = _REGISTRY.setdefault(spec.module, spec)
    if known.table is not spec.table:
        raise ValueError(f"module {spec.module!r} already has run table {known.table.name}")
    return known


def get(module: str) -> RunTable:
    _load_domains()
    try:
        return _REGISTRY[module]
    except KeyError:
        raise KeyError(f"no run table registered for module {module!r}") from None


def all_tables() -> Iterator[RunTable]:
    _load_domains()
    return iter(tuple(_REGISTRY.values()))


def _load_domains() -> None:
    """Import every module that registers a run table, once per process: a command, the
    web or beat sees every domain, whichever modules it happened to import itself."""
    global _loaded  # noqa: PLW0603 - once per process, like the imports themselves
    if _loaded:
        return
    # No lock of ours: a second thread waits on the import system's lock of the module
    # being loaded (which also lets a domain module ask the registry while it loads).
    for name in (*DOMAIN_MODULES, *get_settings().imports):
        importlib.import_module(name)
    _loaded = True


JOBS = register(
    RunTable(
        module="jobs",
        table=JobRun.__table__,  # type: ignore[arg-type]
        stale_policy=StalePolicy.REQUEUE,
        params_column="params",
        # A generic task that exhausted its retries on a transient error (an outage) is
        # worth one more try once things have settled; anything else waits for a human.
        reconcile=ReconcilePolicy(
            retake=frozenset({"TransientError"}), cool_down=timedelta(minutes=30), max_rounds=1
        ),
    )
)
