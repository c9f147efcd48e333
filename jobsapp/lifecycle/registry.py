"""Run tables known to the engine, the reaper, the relay and the admin summary.

A domain registers its table once; monitoring and maintenance then work over every run
table in its own home, without a central table of all jobs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import Table

from jobsapp.lifecycle.tables import JobRun


class StalePolicy(StrEnum):
    """What the reaper does with a run whose heartbeat went stale."""

    REQUEUE = "requeue"
    FAIL = "fail"


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

    def ids_from_row(self, row: Mapping[str, Any]) -> dict[str, Any]:
        return {c: row[c] for c in self.id_columns}


_REGISTRY: dict[str, RunTable] = {}


def register(spec: RunTable) -> RunTable:
    """Make ``spec`` known; registering the same module twice must be the same table."""
    known = _REGISTRY.setdefault(spec.module, spec)
    if known.table is not spec.table:
        raise ValueError(f"module {spec.module!r} already has run table {known.table.name}")
    return known


def get(module: str) -> RunTable:
    try:
        return _REGISTRY[module]
    except KeyError:
        raise KeyError(f"no run table registered for module {module!r}") from None


def all_tables() -> Iterator[RunTable]:
    return iter(tuple(_REGISTRY.values()))


JOBS = register(
    RunTable(
        module="jobs",
        table=JobRun.__table__,  # type: ignore[arg-type]
        stale_policy=StalePolicy.REQUEUE,
        params_column="params",
    )
)
