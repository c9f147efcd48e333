"""Reconcile: a domain's failed runs that are worth another try are taken again.

Each run table declares its ``ReconcilePolicy`` beside its registration; one pass per
domain picks failed runs whose failure carries a retaken code (and no ``never`` code),
that failed longer ago than the cool-down and have had fewer reconcile rounds than the
cap, oldest first, at most a batch. "Carries" is one rule (``_word_pattern``) that the
query applies in SQL and the decision in Python, so a batch holds only runs the decision
takes: failures it never retakes cannot fill it and starve the rest.

Each one goes through the operator's replay (``jobsapp.operator.replay``): a new attempt
of the same job_id, the domain's mirror of the move, and an audit row whose actor is
``operator:reconcile`` (beat) or ``operator:reconcile:<name>`` (by hand) and whose reason
names the pass. Those audit rows are also the round count, so no column of the contract
changes.

Safe to run twice at once: the replay is a guarded transition, the loser gets a refusal
and counts it.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery import Celery
from sqlalchemy import ColumnElement, Engine, ScalarSelect, false, func, or_, select

from jobsapp import operator
from jobsapp.db import utcnow
from jobsapp.lifecycle import registry
from jobsapp.lifecycle.journal import EVENTS
from jobsapp.lifecycle.registry import ReconcilePolicy, RunTable
from jobsapp.lifecycle.states import Outcome, State, Transition
from jobsapp.maintenance.budget import DEFAULT_BUDGET, for_pass

log = logging.getLogger(__name__)

ACTOR = "reconcile"
_ACTOR_AUDIT = operator.ACTOR_PREFIX + ACTOR
# A cancel is an operator's decision and a skip never ran: neither is a failure to retake.
RETAKEN_OUTCOMES = (Outcome.EXHAUSTED.value, Outcome.PERMANENT.value, Outcome.STALE.value)
_WORD_CHARS = "A-Za-z0-9_"


class NeverRetaken(ValueError):
    """An operator asked for a code the domain's policy never takes again."""


@dataclass(frozen=True)
class Request:
    # By hand: only this code, which may be any code the policy does not forbid.
    error_code: str | None = None
    dry_run: bool = False
    actor: str = ACTOR
    now: datetime | None = None


@dataclass
class Report:
    module: str
    pass_id: str
    dry_run: bool
    # (job_id, the code it was taken again for), in the order taken.
    retaken: list[tuple[uuid.UUID, str]] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    # The budget ran out with candidates left: the next pass continues.
    cut_short: bool = False

    def counts(self) -> dict[str, int]:
        return {"retaken": len(self.retaken), **self.refused, "cut_short": int(self.cut_short)}

    def as_json(self) -> dict[str, Any]:
        return {"module": self.module, "pass_id": self.pass_id, "dry_run": self.dry_run,
                "retaken": [{"job_id": str(j), "error_code": c} for j, c in self.retaken],
                "refused": dict(self.refused), "cut_short": self.cut_short}  # fmt: skip


# ------------------------------------------------------------------------ decision


def _word_pattern(code: str) -> str:
    """``code`` as a whole word of a failure record: neither side touches a letter, digit
    or underscore. The same regular expression in PostgreSQL, SQLite (SQLAlchemy's
    REGEXP) and Python."""
    return rf"(^|[^{_WORD_CHARS}]){re.escape(code)}([^{_WORD_CHARS}]|$)"


def carries(record: str | None, code: str) -> bool:
    return record is not None and re.search(_word_pattern(code), record) is not None


def wanted_codes(policy: ReconcilePolicy, error_code: str | None) -> frozenset[str]:
    if error_code is None:
        return policy.retake
    if error_code in policy.never:
        raise NeverRetaken(f"{error_code!r} failures are never taken again: fix the input")
    return frozenset({error_code})


def retake_code(
    record: str | None, wanted: Collection[str], never: Collection[str]
) -> str | None:
    """The wanted code the failure carries, or None when it has none or a ``never`` one."""
    if any(carries(record, code) for code in never):
        return None
    return min((code for code in wanted if carries(record, code)), default=None)


# ------------------------------------------------------------------------- queries


def _rounds(spec: RunTable) -> ScalarSelect[int]:
    """Reconcile replays of the run so far, from the audit rows."""
    table = spec.table
    return (
        select(func.count())
        .select_from(EVENTS)
        .where(
            EVENTS.c.module == spec.module,
            EVENTS.c.job_id == table.c.job_id,
            EVENTS.c.transition == Transition.REPLAY.value,
            or_(EVENTS.c.actor == _ACTOR_AUDIT, EVENTS.c.actor.like(f"{_ACTOR_AUDIT}:%")),
        )
        .scalar_subquery()
    )


def _carries_any(column: ColumnElement[str], codes: Collection[str]) -> ColumnElement[bool]:
    """``carries`` in SQL: the column holds one of ``codes`` as a whole word."""
    return or_(false(), *(column.regexp_match(_word_pattern(c)) for c in sorted(codes)))


def candidates(
    engine: Engine, spec: RunTable, policy: ReconcilePolicy, wanted: Collection[str],
    now: datetime,
) -> list[Mapping[str, Any]]:  # fmt: skip
    """Failed runs that carry a wanted code and no ``never`` one, oldest first."""
    table, rounds = spec.table, _rounds(spec)
    stmt = (
        select(table.c.job_id, table.c.last_error, rounds.label("rounds"))
        .where(
            table.c.state == State.FAILED.value,
            table.c.outcome.in_(RETAKEN_OUTCOMES),
            table.c.finished_at <= now - policy.cool_down,
            _carries_any(table.c.last_error, wanted),
            ~_carries_any(table.c.last_error, policy.never),
            rounds < policy.max_rounds,
        )
        .order_by(table.c.finished_at, table.c.job_id)
        .limit(policy.batch)
    )
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(stmt).mappings()]


# ---------------------------------------------------------------------------- pass


def run_once(engine: Engine, app: Celery, spec: RunTable, request: Request) -> Report:
    """One reconcile pass over ``spec``'s run table."""
    report = Report(spec.module, uuid.uuid4().hex[:12], request.dry_run)
    policy = spec.reconcile
    if policy is None:
        return report
    wanted = wanted_codes(policy, request.error_code)
    if not wanted:
        return report
    budget = for_pass(DEFAULT_BUDGET)
    rows = candidates(engine, spec, policy, wanted, request.now or utcnow())
    for row, code in _decided(rows, wanted, policy.never):
        if not budget.allows_more():
            report.cut_short = True
            break
        if not request.dry_run:
            _retake(engine, app, spec, report, request.actor, row, code, policy.max_rounds)
        else:
            report.retaken.append((row["job_id"], code))
    return report


def _decided(
    rows: list[Mapping[str, Any]], wanted: Collection[str], never: Collection[str]
) -> Iterator[tuple[Mapping[str, Any], str]]:
    for row in rows:
        code = retake_code(row["last_error"], wanted, never)
        if code is not None:
            yield row, code


def _retake(
    engine: Engine, app: Celery, spec: RunTable, report: Report, actor: str,
    row: Mapping[str, Any], code: str, max_rounds: int,
) -> None:  # fmt: skip
    job_id = row["job_id"]
    why = (f"reconcile pass {report.pass_id}: {code}, "
           f"round {int(row['rounds']) + 1} of {max_rounds}")  # fmt: skip
    try:
        operator.replay(engine, spec.module, job_id, actor=actor, reason=why, app=app)
    except operator.Refused as refused:
        # Another pass or an operator moved it meanwhile, or its key is busy: next time.
        report.refused[refused.code] += 1
        return
    report.retaken.append((job_id, code))


def run_all(
    engine: Engine, app: Celery, request: Request, module: str | None = None
) -> list[Report]:
    """A pass per registered domain (or over ``module`` only)."""
    specs = [operator.run_table(module)] if module else list(registry.all_tables())
    reports = [run_once(engine, app, spec, request) for spec in specs]
    for report in reports:
        if report.retaken or report.refused:
            log.info("reconcile %s pass %s: %s", report.module, report.pass_id, report.counts())
    return reports
