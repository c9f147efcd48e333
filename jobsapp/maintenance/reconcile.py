"""Reconcile: a domain's failed runs that are worth another try are taken again.

Each run table declares its ``ReconcilePolicy`` beside its registration; one pass per
domain picks failed runs whose failure carries a retaken code (and no ``never`` code),
that failed longer ago than the cool-down and have had fewer reconcile rounds than the
cap, oldest first, at most a batch. The query (``candidates``, SQL) and the decision
(``decide``, pure Python) state these rules alike, "carries" as one regular expression
(``_word_pattern``), so a batch holds only runs the decision takes: failures it never
retakes cannot fill it and starve the rest.

Each one goes through the operator's replay (``jobsapp.operator.replay``): a new attempt
of the same job_id, the domain's mirror of the move, and an audit row whose actor is
``operator:reconcile`` (beat) or ``operator:reconcile:<name>`` (by hand) and whose reason
names the pass. Those audit rows are also the round count, so no column of the contract
changes.

A dry run also says why, for each of the domain's newest failed runs it leaves alone, the
first rule that holds it back (``HeldBack``): not a failure (a cancel), a ``never`` code,
no retaken code, the rounds cap, the cool-down (until when), or the batch being full.

Safe to run twice at once: the replay is a guarded transition, the loser gets a refusal
and counts it.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from celery import Celery
from sqlalchemy import ColumnElement, Engine, ScalarSelect, Select, false, func, or_, select

from jobsapp import operator
from jobsapp.db import utcnow
from jobsapp.lifecycle.journal import EVENTS, registry
from jobsapp.lifecycle.journal.registry import ReconcilePolicy, RunTable
from jobsapp.lifecycle.rules.states import Outcome, State, Transition
from jobsapp.maintenance.budget import DEFAULT_BUDGET, for_pass

log = logging.getLogger(__name__)

ACTOR = "reconcile"
_ACTOR_AUDIT = operator.ACTOR_PREFIX + ACTOR
# A cancel is an operator's decision and a skip never ran: neither is a failure to retake.
RETAKEN_OUTCOMES = (Outcome.EXHAUSTED.value, Outcome.PERMANENT.value, Outcome.STALE.value)
_WORD_CHARS = "A-Za-z0-9_"
# A dry run explains at most this many of a domain's failed runs it leaves alone.
HELD_BACK_SHOWN = 100


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
    # A dry run only: the newest failed runs left alone, each with why.
    held_back: list[tuple[uuid.UUID, HeldBack]] = field(default_factory=list)
    # More failed runs are left alone than ``held_back`` lists.
    held_back_more: bool = False

    def counts(self) -> dict[str, int]:
        return {"retaken": len(self.retaken), **self.refused, "cut_short": int(self.cut_short)}

    def as_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "pass_id": self.pass_id,
            "dry_run": self.dry_run,
            "retaken": [{"job_id": str(j), "error_code": c} for j, c in self.retaken],
            "refused": dict(self.refused),
            "cut_short": self.cut_short,
            "held_back": [
                {"job_id": str(j), "rule": h.rule.value, "why": h.line()} for j, h in self.held_back
            ],
            "held_back_more": self.held_back_more,
        }


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


class Rule(StrEnum):
    """Why a failed run is left alone, in the order the decision asks."""

    NOT_A_FAILURE = "not_a_failure"
    NEVER_RETAKEN = "never_retaken"
    NOT_RETRYABLE = "not_retryable"
    ROUNDS_CAP = "rounds_cap"
    COOL_DOWN = "cool_down"
    BATCH_FULL = "batch_full"


_LINES = {
    Rule.NOT_A_FAILURE: "outcome {}: reconcile retakes only exhausted, permanent or stale runs",
    Rule.NEVER_RETAKEN: "error code {} is never retaken",
    Rule.NOT_RETRYABLE: "error code not retryable: the error carries none of {}",
    Rule.ROUNDS_CAP: "rounds cap reached: {} reconcile rounds spent",
    Rule.COOL_DOWN: "cool-down until {}",
    Rule.BATCH_FULL: "batch full: {}",
}


@dataclass(frozen=True)
class HeldBack:
    """The rule that keeps a failed run failed, and what it found (a code, a time, ...)."""

    rule: Rule
    detail: str

    def line(self) -> str:
        return _LINES[self.rule].format(self.detail)


# Left alone by a pass that took its batch or spent its time budget first.
BATCH_FULL = HeldBack(Rule.BATCH_FULL, "a later pass takes it")


@dataclass(frozen=True)
class Retake:
    code: str


@dataclass(frozen=True)
class Failure:
    """What the decision reads of a failed run."""

    outcome: str | None
    last_error: str | None
    finished_at: datetime
    # Reconcile replays of the job so far.
    rounds: int


def code_decision(
    record: str | None, wanted: Collection[str], never: Collection[str]
) -> Retake | HeldBack:
    """The wanted code the failure carries; held back when it carries a ``never`` one or
    none wanted."""
    if forbidden := min((code for code in never if carries(record, code)), default=None):
        return HeldBack(Rule.NEVER_RETAKEN, forbidden)
    if found := min((code for code in wanted if carries(record, code)), default=None):
        return Retake(found)
    return HeldBack(Rule.NOT_RETRYABLE, ", ".join(sorted(wanted)))


def decide(
    failure: Failure, policy: ReconcilePolicy, wanted: Collection[str], now: datetime
) -> Retake | HeldBack:
    """Whether a pass at ``now`` takes the failure again; else the first rule against it,
    the lasting ones before the cool-down, which only delays."""
    if failure.outcome not in RETAKEN_OUTCOMES:
        return HeldBack(Rule.NOT_A_FAILURE, str(failure.outcome))
    decision = code_decision(failure.last_error, wanted, policy.never)
    if isinstance(decision, HeldBack):
        return decision
    if failure.rounds >= policy.max_rounds:
        return HeldBack(Rule.ROUNDS_CAP, f"{failure.rounds} of {policy.max_rounds}")
    if (until := failure.finished_at + policy.cool_down) > now:
        return HeldBack(Rule.COOL_DOWN, until.astimezone(UTC).isoformat(timespec="seconds"))
    return decision


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


def _failed(spec: RunTable) -> Select[Any]:
    """The failed runs of ``spec`` with what ``decide`` reads of them."""
    table = spec.table
    columns = (
        table.c.outcome,
        table.c.last_error,
        table.c.finished_at,
        _rounds(spec).label("rounds"),
    )
    return select(table.c.job_id, *columns).where(table.c.state == State.FAILED.value)


def candidates(
    engine: Engine,
    spec: RunTable,
    policy: ReconcilePolicy,
    wanted: Collection[str],
    now: datetime,
) -> list[Mapping[str, Any]]:
    """``decide``'s retaken runs in SQL: failed runs that carry a wanted code and no
    ``never`` one, past the cool-down and under the rounds cap, oldest first."""
    table = spec.table
    stmt = (
        _failed(spec)
        .where(
            table.c.outcome.in_(RETAKEN_OUTCOMES),
            table.c.finished_at <= now - policy.cool_down,
            _carries_any(table.c.last_error, wanted),
            ~_carries_any(table.c.last_error, policy.never),
            _rounds(spec) < policy.max_rounds,
        )
        .order_by(table.c.finished_at, table.c.job_id)
        .limit(policy.batch)
    )
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(stmt).mappings()]


def left_alone(
    engine: Engine, spec: RunTable, taken: Collection[uuid.UUID], limit: int
) -> list[Mapping[str, Any]]:
    """The newest failed runs but ``taken``, at most ``limit`` and one more (so the caller
    knows there are more)."""
    table = spec.table
    stmt = (
        _failed(spec)
        .where(table.c.job_id.not_in(list(taken)))
        .order_by(table.c.finished_at.desc(), table.c.job_id)
        .limit(limit + 1)
    )
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(stmt).mappings()]


# ---------------------------------------------------------------------------- pass


def failure_of(row: Mapping[str, Any]) -> Failure:
    return Failure(row["outcome"], row["last_error"], row["finished_at"], int(row["rounds"]))


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
    now = request.now or utcnow()
    for row in candidates(engine, spec, policy, wanted, now):
        decision = decide(failure_of(row), policy, wanted, now)
        if not isinstance(decision, Retake):
            continue
        if not budget.allows_more():
            report.cut_short = True
            break
        if not request.dry_run:
            _retake(engine, app, spec, report, request.actor, row, decision.code, policy.max_rounds)
        else:
            report.retaken.append((row["job_id"], decision.code))
    if request.dry_run:
        _explain(engine, spec, report, policy, wanted, now)
    return report


def _explain(
    engine: Engine,
    spec: RunTable,
    report: Report,
    policy: ReconcilePolicy,
    wanted: Collection[str],
    now: datetime,
) -> None:
    """Why the pass leaves each of the newest other failed runs alone."""
    rows = left_alone(engine, spec, [job for job, _ in report.retaken], HELD_BACK_SHOWN)
    report.held_back_more = len(rows) > HELD_BACK_SHOWN
    for row in rows[:HELD_BACK_SHOWN]:
        decision = decide(failure_of(row), policy, wanted, now)
        report.held_back.append(
            (row["job_id"], BATCH_FULL if isinstance(decision, Retake) else decision)
        )


def _retake(
    engine: Engine,
    app: Celery,
    spec: RunTable,
    report: Report,
    actor: str,
    row: Mapping[str, Any],
    code: str,
    max_rounds: int,
) -> None:
    job_id = row["job_id"]
    why = f"reconcile pass {report.pass_id}: {code}, round {int(row['rounds']) + 1} of {max_rounds}"
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
