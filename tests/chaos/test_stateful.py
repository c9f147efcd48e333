"""The lifecycle as a state machine: random transitions from several connections, checked
against a model and against the contract's invariants on real PostgreSQL.

Hypothesis drives the real ``jobsapp.lifecycle.journal`` functions, each transition in its
own transaction on one of three connections, and some steps run two transitions at once in
threads. A small model predicts every answer and every row. Two transitions that ran at
once must match one of their serial orders (READ COMMITTED plus the guards must make them
serialisable); the only extra outcome allowed is the reaper's ``SKIP LOCKED`` passing over
a row the other transaction held. After every step the database is checked for what an
operator would rely on: one active run per key, attempts that never go back, terminal rows
with ``finished_at``, one outbox row per (job, attempt) and one for every queued job's next
attempt, one ``job_events`` row per transition, and a fenced write from an old attempt that
changed nothing.

A second, smaller machine does the same for the attachment a client sees: whatever the
runs, the reaper, operators and late (zombie) attempts do, ``ready`` never goes back.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from itertools import permutations, product
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Connection, Engine, func, select, text

from jobsapp.attachments import tasks as attachment_tasks
from jobsapp.attachments.models import (
    ATTACHMENT_RUNS,
    ATTACHMENTS,
    AttachmentState,
    mirror_run_change,
)
from jobsapp.attachments.pipeline import RenderedVariant, get_pipeline
from jobsapp.db import utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import KeyBusy, NewJob, StaleRun
from jobsapp.lifecycle.journal.registry import JOBS, RunTable
from jobsapp.lifecycle.journal.row_events import carries_success, row_events
from jobsapp.lifecycle.journal.tables import JobEvent, JobRun, OutboxMessage
from jobsapp.lifecycle.rules.errors import LeaseLost
from jobsapp.lifecycle.rules.states import (
    ACTIVE_STATES,
    ALL_STATES,
    TERMINAL_STATES,
    Outcome,
    State,
    Transition,
)
from jobsapp.lifecycle.worker.context import RunContext
from jobsapp.lifecycle.worker.heartbeat import Heartbeat
from jobsapp.maintenance import reaper
from tests.support.env import examples
from tests.support.runs import a_run

RUN_TABLE = JobRun.__table__
OUTBOX = OutboxMessage.__table__
EVENTS = JobEvent.__table__

# Small spaces, so that keys collide and the same job is hit from several sides.
JOB_IDS = tuple(uuid.UUID(int=0xC4A05 << 64 | i) for i in range(5))
KEYS = ("acct:a", "acct:b", "acct:c")
TASK_NAME = "tests.chaos.stateful"
# Small budgets so that the reaper's "no attempts left" and "rescued too often" happen.
MAX_ATTEMPTS = 2
REPLAY_BUDGET = 2
DEDUP_WINDOW = timedelta(days=1)
STALE_AFTER = timedelta(seconds=30)
TICK = timedelta(seconds=1)
CONNECTIONS = 3

# Derandomized (tests/conftest.py), these are the same sequences on every run: the gate
# replays a fixed set (a smaller one than explore: the same set each time), and new
# sequences come from the HYPOTHESIS_PROFILE=explore run.
MACHINE_SETTINGS = settings(
    max_examples=examples(ci=50, explore=200),
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Row:
    """What the model knows of a run row: every column a transition writes."""

    key: str
    state: str
    attempts: int
    max_attempts: int
    rescues: int = 0
    outcome: str | None = None
    next_retry_at: datetime | None = None
    heartbeat_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class Model:
    rows: Mapping[uuid.UUID, Row] = field(default_factory=dict)
    outbox: frozenset[tuple[uuid.UUID, int]] = frozenset()
    events: int = 0

    def state_of(self, job_id: uuid.UUID) -> str | None:
        row = self.rows.get(job_id)
        return None if row is None else row.state

    def holder(self, key: str, *, other_than: uuid.UUID | None = None) -> uuid.UUID | None:
        for job_id, row in self.rows.items():
            if row.key == key and row.state in ACTIVE_STATES and job_id != other_than:
                return job_id
        return None


@dataclass(frozen=True)
class Op:
    """One transition as drawn; ``token`` says how to pick its attempt from the model."""

    kind: str
    job: int = 0
    key: int = 0
    token: str = "current"
    due: bool = True
    window: bool = False
    outcome: str = Outcome.PERMANENT.value
    attempt: int = 0  # resolved against the model just before the step runs
    skip: frozenset[uuid.UUID] = frozenset()  # reap: rows another transaction held locked
    anywhere: bool = False  # not steered to a job in the state the transition leaves

    @property
    def job_id(self) -> uuid.UUID:
        return JOB_IDS[self.job]

    def resolved(self, model: Model) -> Op:
        """Aim at a job the transition can apply to, then turn the token into an attempt.

        Most draws are steered to a job in the state the transition leaves (a queued job
        for a claim, a running one for a heartbeat), so that the races are about live
        jobs; ``ahead`` tokens and the "any" draws keep hitting the others.
        """
        wanted = WANTED_STATE.get(self.kind)
        if wanted is not None and self.token != "ahead" and not self.anywhere:
            targets = [i for i, job_id in enumerate(JOB_IDS) if model.state_of(job_id) == wanted]
            if targets:
                aimed = replace(self, job=targets[self.job % len(targets)], anywhere=True)
                return aimed.resolved(model)
        row = model.rows.get(self.job_id)
        attempts = row.attempts if row else 0
        if self.kind == "claim_by_insert":
            picked = {"current": 1, "old": 2, "ahead": 3}[self.token]
        elif self.kind == "claim":
            # current: the next attempt; old: a redelivery of a started one; ahead: never scheduled
            picked = {
                "current": attempts + 1,
                "old": max(attempts, 1) if attempts else 3,
                "older": max(attempts - 1, 1),
                "ahead": attempts + 2,
            }[self.token]
        else:
            picked = {
                "current": attempts,
                "old": attempts - 1,
                "older": attempts - 2,
                "ahead": attempts + 1,
            }[self.token]
            if self.kind != "replay":
                # A worker's token is an attempt it was given: 1 or more (the schema's minimum).
                picked = max(picked, 1)
        return replace(self, attempt=picked)


WANTED_STATE = {
    "claim": State.QUEUED,
    "cancel": State.QUEUED,
    "replay": State.FAILED,
    **{kind: State.RUNNING for kind in ("heartbeat", "succeed", "fail", "retry", "snooze")},
}

FENCED = frozenset({"heartbeat", "succeed", "fail", "retry", "snooze"})

Result = Any  # bool, an enqueue outcome, or the reaper's frozenset of (job_id, requeued)


def _would_requeue(row: Row) -> bool:
    """The reaper's rule (jobsapp.maintenance.reaper.should_requeue), stated on its own."""
    return row.attempts < row.max_attempts and row.rescues < JOBS.rescue_limit


def _requeue_at(op: Op, now: datetime) -> datetime:
    return now - TICK if op.due else now + timedelta(hours=1)


def simulate(model: Model, op: Op, now: datetime) -> tuple[Result, Model]:  # noqa: PLR0911, PLR0912
    """What the journal must answer and leave behind for ``op`` run alone on ``model``."""
    rows = dict(model.rows)
    outbox = set(model.outbox)
    row = rows.get(op.job_id)

    def done(
        result: Result, new_row: Row | None = None, *, message: int | None = None, events: int = 1
    ) -> tuple[Result, Model]:
        if new_row is not None:
            rows[op.job_id] = new_row
        if message is not None:
            outbox.add((op.job_id, message))
        return result, Model(rows, frozenset(outbox), model.events + events)

    refused: tuple[Result, Model] = (False, model)
    if op.kind == "enqueue":
        if row is None:
            if model.holder(KEYS[op.key]) is not None:
                return "skipped", model
            assert (op.job_id, 1) not in outbox, "model: a new job with an old message"
            return done("enqueued", Row(KEYS[op.key], State.QUEUED, 0, MAX_ATTEMPTS), message=1)
        window = DEDUP_WINDOW if op.window else timedelta(0)
        if row.finished_at is None or row.finished_at > now - window:
            return "duplicate", model
        if model.holder(row.key, other_than=op.job_id) is not None:
            return "skipped", model
        return done("enqueued", _reopened(row, MAX_ATTEMPTS), message=row.attempts + 1)
    if op.kind == "claim_by_insert":
        if row is not None or model.holder(KEYS[op.key]) is not None:
            return refused
        return done(
            True, Row(KEYS[op.key], State.RUNNING, op.attempt, MAX_ATTEMPTS, heartbeat_at=now)
        )
    if op.kind == "claim":
        due = row is not None and (row.next_retry_at is None or row.next_retry_at <= now)
        if row is None or row.state != State.QUEUED or row.attempts != op.attempt - 1 or not due:
            return refused
        return done(
            True,
            replace(
                row, state=State.RUNNING, attempts=op.attempt, heartbeat_at=now, next_retry_at=None
            ),
        )
    if op.kind == "cancel":
        if row is None or row.state != State.QUEUED or row.attempts != op.attempt:
            return refused
        return done(
            True,
            replace(
                row,
                state=State.FAILED,
                outcome=Outcome.CANCELLED,
                finished_at=now,
                next_retry_at=None,
            ),
        )
    if op.kind == "replay":
        if row is None or row.state != State.FAILED or row.attempts != op.attempt:
            return refused
        if model.holder(row.key, other_than=op.job_id) is not None:
            return "busy", model
        return done(True, _reopened(row, REPLAY_BUDGET), message=row.attempts + 1)
    if op.kind == "reap":
        return _simulate_reap(model, op, now)
    # The fenced transitions of the attempt holder.
    if row is None or row.state != State.RUNNING or row.attempts != op.attempt:
        return refused
    if op.kind == "heartbeat":
        return done(True, replace(row, heartbeat_at=now), events=0)
    if op.kind == "succeed":
        return done(
            True, replace(row, state=State.SUCCEEDED, outcome=Outcome.SUCCEEDED, finished_at=now)
        )
    if op.kind == "fail":
        return done(True, replace(row, state=State.FAILED, outcome=op.outcome, finished_at=now))
    assert op.kind in ("retry", "snooze"), op
    assert (op.job_id, row.attempts + 1) not in outbox, "model: requeue onto an existing message"
    refund = int(op.kind == "snooze")
    return done(
        True,
        replace(
            row,
            state=State.QUEUED,
            next_retry_at=_requeue_at(op, now),
            heartbeat_at=None,
            max_attempts=row.max_attempts + refund,
        ),
        message=row.attempts + 1,
    )


def _reopened(row: Row, budget: int) -> Row:
    return replace(
        row,
        state=State.QUEUED,
        outcome=None,
        finished_at=None,
        heartbeat_at=None,
        next_retry_at=None,
        max_attempts=row.attempts + budget,
        rescues=0,
    )


def _simulate_reap(model: Model, op: Op, now: datetime) -> tuple[Result, Model]:
    rows = dict(model.rows)
    outbox = set(model.outbox)
    reaped: set[tuple[uuid.UUID, bool]] = set()
    for job_id, row in model.rows.items():
        if row.state != State.RUNNING or job_id in op.skip:
            continue
        if _would_requeue(row):
            rows[job_id] = replace(
                row,
                state=State.QUEUED,
                rescues=row.rescues + 1,
                heartbeat_at=None,
                next_retry_at=None,
            )
            outbox.add((job_id, row.attempts + 1))
        else:
            rows[job_id] = replace(
                row, state=State.FAILED, outcome=Outcome.STALE, heartbeat_at=None, finished_at=now
            )
        reaped.add((job_id, _would_requeue(row)))
    return frozenset(reaped), Model(rows, frozenset(outbox), model.events + len(reaped))


# ----------------------------------------------------------------------- the real thing


def _new_job(op: Op) -> NewJob:
    return NewJob(
        spec=JOBS,
        job_id=op.job_id,
        task_name=TASK_NAME,
        concurrency_key=KEYS[op.key],
        max_attempts=MAX_ATTEMPTS,
        values={"params": {"args": [], "kwargs": {"n": op.job}}},
        dedup_window=DEDUP_WINDOW if op.window else timedelta(0),
    )


class Claims(dict[tuple[uuid.UUID, int], uuid.UUID]):
    """The token each claim of (job, attempt) was given: what its worker's writes name.
    A worker's write for an attempt nobody claimed names a token nobody holds."""

    def took(self, op: Op, row: journal.Run | None) -> bool:
        if row is not None:
            self[(op.job_id, op.attempt)] = row.claimed_token
        return row is not None

    def of(self, op: Op) -> uuid.UUID:
        return self.get((op.job_id, op.attempt)) or uuid.uuid4()


def execute(conn: Connection, op: Op, now: datetime, claims: Claims) -> Result:  # noqa: PLR0911
    """Run ``op`` through the journal in its own transaction on ``conn``."""
    worker = f"chaos:{op.job}"
    with conn.begin():
        if op.kind == "enqueue":
            return journal.enqueue(conn, _new_job(op), now=now, actor="producer").outcome.value
        if op.kind == "claim_by_insert":
            row = journal.claim_by_insert(conn, _new_job(op), op.attempt, worker=worker, now=now)
            return claims.took(op, row)
        if op.kind == "claim":
            row = journal.claim(conn, JOBS, op.job_id, op.attempt, worker=worker, now=now)
            return claims.took(op, row)
        token = claims.of(op)
        if op.kind == "heartbeat":
            return journal.heartbeat(conn, JOBS, op.job_id, op.attempt, token=token, now=now)
        if op.kind == "succeed":
            return journal.succeed(
                conn, JOBS, op.job_id, op.attempt, token=token, actor=worker, now=now
            )
        if op.kind == "fail":
            return journal.fail(
                conn,
                JOBS,
                op.job_id,
                op.attempt,
                token=token,
                outcome=Outcome(op.outcome),
                error="ValueError: upstream said no",
                actor=worker,
                now=now,
            )
        if op.kind in ("retry", "snooze"):
            run = a_run(
                job_id=op.job_id, attempts=op.attempt, task_name=TASK_NAME, claim_token=token
            )
            transition = Transition.SNOOZE if op.kind == "snooze" else Transition.RETRY
            message = journal.requeue(
                conn,
                JOBS,
                run,
                retry_at=_requeue_at(op, now),
                error="ConnectionError: later",
                transition=transition,
                actor=worker,
                now=now,
                refund=op.kind == "snooze",
            )
            return message is not None
        if op.kind == "cancel":
            return journal.cancel(
                conn,
                JOBS,
                op.job_id,
                attempts=op.attempt,
                actor="operator:chaos",
                reason="cancelled by chaos",
                now=now,
            )
        if op.kind == "replay":
            try:
                message = journal.reopen(
                    conn,
                    JOBS,
                    op.job_id,
                    from_state=State.FAILED,
                    attempts=op.attempt,
                    budget=REPLAY_BUDGET,
                    transition=Transition.REPLAY,
                    now=now,
                    actor="operator:chaos",
                    reason="replayed by chaos",
                )
            except KeyBusy:
                return "busy"
            return message is not None
        assert op.kind == "reap", op
        return reap_pass(conn, JOBS, now)


def reap_pass(conn: Connection, spec: RunTable, now: datetime) -> frozenset[tuple[uuid.UUID, bool]]:
    """The reaper's pass (as in ``reaper._reap_table``) with a cutoff in the future, so every
    running row counts as stale."""
    cutoff = now + timedelta(hours=1)
    stale = journal.find_stale(conn, spec, cutoff=cutoff, limit=100)
    groups: dict[str, list[StaleRun]] = defaultdict(list)
    for run in stale:
        groups[reaper.reason_for(run, spec, STALE_AFTER)].append(run)
    reaped: set[tuple[uuid.UUID, bool]] = set()
    for reason, runs in groups.items():
        requeue_them = reaper.should_requeue(runs[0], spec)
        done = journal.reap(
            conn, spec, runs, requeue_them=requeue_them, cutoff=cutoff, reason=reason, now=now
        )
        reaped |= {(r.job_id, requeue_them) for r in done}
    return frozenset(reaped)


def run_together(calls: Sequence[Callable[[], Result]]) -> list[Result]:
    """Start the calls at the same instant on their own threads; re-raise what failed."""
    barrier = threading.Barrier(len(calls))
    results: list[Result] = [None] * len(calls)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a transition hung (lock wait or deadlock)"
    if errors:
        raise errors[0]
    return results


def read_rows(conn: Connection) -> dict[uuid.UUID, dict[str, Any]]:
    return {r["job_id"]: dict(r) for r in conn.execute(select(RUN_TABLE)).mappings()}


def as_model_row(r: Mapping[str, Any]) -> Row:
    return Row(
        key=r["concurrency_key"],
        state=r["state"],
        attempts=r["attempts"],
        max_attempts=r["max_attempts"],
        rescues=r["rescues"],
        outcome=r["outcome"],
        next_retry_at=r["next_retry_at"],
        heartbeat_at=r["heartbeat_at"],
        finished_at=r["finished_at"],
    )


def read_model(conn: Connection) -> Model:
    rows = {job_id: as_model_row(r) for job_id, r in read_rows(conn).items()}
    outbox = frozenset(
        (r.job_id, r.attempt) for r in conn.execute(select(OUTBOX.c.job_id, OUTBOX.c.attempt))
    )
    # One event per transition: the event rows, and those the run rows carry.
    events = conn.execute(select(func.count()).select_from(EVENTS)).scalar_one()
    carried = sum(len(row_events(JOBS.module, r)) for r in read_rows(conn).values())
    return Model(rows, outbox, int(events) + carried)


def serial_candidates(
    model: Model, ops: Sequence[Op], now: datetime, actual: Sequence[Result]
) -> Iterator[tuple[list[Result], Model]]:
    """Every outcome the pair may legally have: each serial order, and a reaper that
    skipped (SKIP LOCKED) the rows the other transaction held."""
    locked: list[frozenset[uuid.UUID]] = []
    for op, result in zip(ops, actual, strict=True):
        if op.kind == "reap":
            locked.append(frozenset(job_id for job_id, _ in result))
        else:
            locked.append(frozenset({op.job_id}))
    skips: list[list[frozenset[uuid.UUID]]] = []
    for i, op in enumerate(ops):
        others = frozenset().union(*(locked[j] for j in range(len(ops)) if j != i))
        skips.append([frozenset(), others] if op.kind == "reap" else [frozenset()])
    for skip_choice in product(*skips):
        variants = [replace(op, skip=s) for op, s in zip(ops, skip_choice, strict=True)]
        for order in permutations(range(len(ops))):
            state = model
            results: list[Result] = [None] * len(ops)
            for i in order:
                results[i], state = simulate(state, variants[i], now)
            yield results, state


# ---------------------------------------------------------------------------- machine

jobs = st.integers(0, len(JOB_IDS) - 1)
keys = st.integers(0, len(KEYS) - 1)
mostly = st.sampled_from([True, True, True, False])
fence_tokens = st.sampled_from(["current", "current", "old", "older", "ahead"])
claim_tokens = st.sampled_from(["current", "current", "current", "old", "older", "ahead"])

OPS: dict[str, st.SearchStrategy[Op]] = {
    "enqueue": st.builds(Op, kind=st.just("enqueue"), job=jobs, key=keys, window=st.booleans()),
    "claim_by_insert": st.builds(
        Op,
        kind=st.just("claim_by_insert"),
        job=jobs,
        key=keys,
        token=st.sampled_from(["current", "old", "ahead"]),
    ),
    "claim": st.builds(Op, kind=st.just("claim"), job=jobs, token=claim_tokens),
    "heartbeat": st.builds(Op, kind=st.just("heartbeat"), job=jobs, token=fence_tokens),
    "succeed": st.builds(Op, kind=st.just("succeed"), job=jobs, token=fence_tokens),
    "fail": st.builds(
        Op,
        kind=st.just("fail"),
        job=jobs,
        token=fence_tokens,
        outcome=st.sampled_from([Outcome.PERMANENT.value, Outcome.EXHAUSTED.value]),
    ),
    "retry": st.builds(Op, kind=st.just("retry"), job=jobs, token=fence_tokens, due=mostly),
    "snooze": st.builds(Op, kind=st.just("snooze"), job=jobs, token=fence_tokens, due=mostly),
    "replay": st.builds(
        Op,
        kind=st.just("replay"),
        job=jobs,
        token=st.sampled_from(["current", "current", "old", "ahead"]),
    ),
    "cancel": st.builds(Op, kind=st.just("cancel"), job=jobs, anywhere=mostly.map(lambda x: not x)),
    "reap": st.just(Op(kind="reap")),
}
ANY_OP = st.one_of(*OPS.values())
VIA = st.integers(0, CONNECTIONS - 1)


class LifecycleMachine(RuleBasedStateMachine):
    """Bound to a database by subclassing with ``engine`` set (see the test below)."""

    engine: ClassVar[Engine]

    def __init__(self) -> None:
        super().__init__()
        with self.engine.begin() as conn:
            for table in ("job_events", "outbox", "job_runs"):
                conn.execute(text(f"DELETE FROM {table}"))
        self.conns = [self.engine.connect() for _ in range(CONNECTIONS)]
        self.model = Model()
        self.now = utcnow()
        self.highest_attempts: dict[uuid.UUID, int] = {}
        self.claims = Claims()

    def teardown(self) -> None:
        for conn in self.conns:
            conn.close()

    # --- one step: one transition, or two at once ---------------------------------------

    def step(self, drawn: Sequence[Op], via: int) -> None:
        self.now += TICK
        now = self.now
        ops = [op.resolved(self.model) for op in drawn]
        with self.engine.connect() as observer:
            before_rows = read_rows(observer)
        conns = [self.conns[(via + i) % CONNECTIONS] for i in range(len(ops))]
        if len(ops) == 1:
            actual = [execute(conns[0], ops[0], now, self.claims)]
        else:
            actual = run_together(
                [
                    lambda c=c, op=op: execute(c, op, now, self.claims)
                    for c, op in zip(conns, ops, strict=True)
                ]
            )
        with self.engine.connect() as observer:
            seen = read_model(observer)
            after_rows = read_rows(observer)
        matches = [
            (results, model)
            for results, model in serial_candidates(self.model, ops, now, actual)
            if results == actual and model == seen
        ]
        assert matches, self._explain(ops, actual, seen)
        if len(ops) == 1:
            self._check_refusal_changed_nothing(ops[0], actual[0], before_rows, after_rows)
        for op, result in zip(ops, actual, strict=True):
            shown = sorted(r for _, r in result) if op.kind == "reap" else result
            event(f"{'pair' if len(ops) > 1 else 'single'} {op.kind}({op.token}) -> {shown}")
        self.model = seen

    def _check_refusal_changed_nothing(
        self,
        op: Op,
        result: Result,
        before: Mapping[uuid.UUID, Any],
        after: Mapping[uuid.UUID, Any],
    ) -> None:
        """A fenced write with a token that is not the running attempt's is refused, and a
        refused transition (an old attempt's write, a duplicate) leaves every byte."""
        row = self.model.rows.get(op.job_id)
        holder = row is not None and row.state == State.RUNNING and row.attempts == op.attempt
        if op.kind in FENCED and not holder:
            assert result is False, f"{op}: a write from a stale attempt landed"
        if result in (False, "duplicate", "skipped", "busy") or result == frozenset():
            assert after == before, f"{op} was refused ({result!r}) yet changed rows"

    def _explain(self, ops: Sequence[Op], actual: Sequence[Result], seen: Model) -> str:
        lines = [f"no serial order explains {ops} -> {actual}"]
        for results, model in serial_candidates(self.model, ops, self.now, actual):
            lines.append(f"  candidate results {results}")
            for job_id in sorted(set(model.rows) | set(seen.rows)):
                if model.rows.get(job_id) != seen.rows.get(job_id):
                    lines.append(f"    {job_id}: model {model.rows.get(job_id)}")
                    lines.append(f"    {' ' * len(str(job_id))}  db    {seen.rows.get(job_id)}")
            if model.outbox != seen.outbox:
                lines.append(
                    f"    outbox model-db {set(model.outbox) - set(seen.outbox)}, "
                    f"db-model {set(seen.outbox) - set(model.outbox)}"
                )
            if model.events != seen.events:
                lines.append(f"    events: model {model.events}, db {seen.events}")
        return "\n".join(lines)

    # --- rules ----------------------------------------------------------------------------

    @rule(op=OPS["enqueue"], via=VIA)
    def enqueue(self, op: Op, via: int) -> None:
        """A producer's enqueue: new, duplicate (same job_id), rerun, or a busy key."""
        self.step([op], via)

    @rule(op=OPS["claim_by_insert"], via=VIA)
    def claim_by_insert(self, op: Op, via: int) -> None:
        """A foreign producer's message with no journal row."""
        self.step([op], via)

    @rule(op=OPS["claim"], via=VIA)
    def claim(self, op: Op, via: int) -> None:
        """The right attempt, a redelivered (old) one, or one never scheduled."""
        self.step([op], via)

    @rule(op=OPS["heartbeat"], via=VIA)
    def heartbeat(self, op: Op, via: int) -> None:
        self.step([op], via)

    @rule(op=OPS["succeed"], via=VIA)
    def succeed(self, op: Op, via: int) -> None:
        self.step([op], via)

    @rule(op=OPS["fail"], via=VIA)
    def fail(self, op: Op, via: int) -> None:
        self.step([op], via)

    @rule(op=OPS["retry"], via=VIA)
    def transient_failure(self, op: Op, via: int) -> None:
        self.step([op], via)

    @rule(op=OPS["snooze"], via=VIA)
    def retry_after(self, op: Op, via: int) -> None:
        self.step([op], via)

    @rule(op=OPS["replay"], via=VIA)
    def replay(self, op: Op, via: int) -> None:
        self.step([op], via)

    @rule(op=OPS["cancel"], via=VIA)
    def cancel(self, op: Op, via: int) -> None:
        self.step([op], via)

    @rule(op=OPS["reap"], via=VIA)
    def reaper_pass(self, op: Op, via: int) -> None:
        self.step([op], via)

    @rule(first=ANY_OP, second=ANY_OP, via=VIA)
    def two_at_once(self, first: Op, second: Op, via: int) -> None:
        """Any two transitions at the same instant, from two connections."""
        self.step([first, second], via)

    @rule(op=ANY_OP, via=VIA)
    def the_same_twice_at_once(self, op: Op, via: int) -> None:
        """A duplicate delivery, two producers, two operators: both aimed at the same job."""
        self.step([op, op], via)

    @rule(op=ANY_OP, via=VIA)
    def against_the_reaper(self, op: Op, via: int) -> None:
        """A worker (or producer, or operator) racing a reaper pass."""
        self.step([op, Op(kind="reap")], via)

    # --- invariants, read from the database -------------------------------------------------

    def _query(self, sql: str) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(text(sql)))

    @invariant()
    def at_most_one_active_run_per_key(self) -> None:
        doubled = self._query(
            "SELECT concurrency_key, count(*) FROM job_runs "
            "WHERE state IN ('queued', 'running') GROUP BY concurrency_key HAVING count(*) > 1"
        )
        assert doubled == []

    @invariant()
    def attempts_never_decrease(self) -> None:
        for job_id, attempts in self._query("SELECT job_id, attempts FROM job_runs"):
            assert attempts >= self.highest_attempts.get(job_id, 0), job_id
            self.highest_attempts[job_id] = attempts
        for job_id in self.highest_attempts:
            assert job_id in {r[0] for r in self._query("SELECT job_id FROM job_runs")}

    @invariant()
    def finished_at_iff_terminal(self) -> None:
        for state, outcome, finished_at, heartbeat_at in self._query(
            "SELECT state, outcome, finished_at, heartbeat_at FROM job_runs"
        ):
            assert state in ALL_STATES
            if state in TERMINAL_STATES:
                assert finished_at is not None
                assert outcome in {o.value for o in Outcome}
            else:
                assert finished_at is None
                assert outcome is None
            assert state != State.RUNNING or heartbeat_at is not None

    @invariant()
    def one_outbox_row_per_attempt_and_one_for_each_queued_job(self) -> None:
        assert (
            self._query(
                "SELECT job_id, attempt FROM outbox GROUP BY job_id, attempt HAVING count(*) > 1"
            )
            == []
        )
        missing = self._query(
            "SELECT r.job_id, r.attempts FROM job_runs r WHERE r.state = 'queued' AND NOT EXISTS "
            "(SELECT 1 FROM outbox o WHERE o.job_id = r.job_id AND o.attempt = r.attempts + 1)"
        )
        assert missing == [], "a queued job has no message for its next attempt"
        bodies = self._query("SELECT job_id, attempt, body FROM outbox")
        for job_id, attempt, body in bodies:
            assert (body["job_id"], body["attempt"]) == (str(job_id), attempt)

    @invariant()
    def the_last_event_names_the_current_state(self) -> None:
        """In each job's history (event rows and what its run row carries, as the
        timeline reads it)."""
        with self.engine.connect() as conn:
            for job_id, row in read_rows(conn).items():
                seen = journal.history(conn, JOBS, job_id)
                assert seen, f"run {job_id} without the event that created it"
                assert seen[-1]["to_state"] == row["state"], (job_id, seen)


def test_lifecycle_transitions_from_several_connections_keep_the_contract(pg: Engine) -> None:
    machine = type("BoundLifecycleMachine", (LifecycleMachine,), {"engine": pg})
    run_state_machine_as_test(machine, settings=MACHINE_SETTINGS)


# ------------------------------------------------------------------ attachments: ready stays


ATTACHMENT_ID = uuid.UUID(int=0xA77AC4 << 64)
VERSIONS = (1, 2)
RUN_IDS = {v: uuid.UUID(int=0xA77AC4 << 64 | v) for v in VERSIONS}


def _attachment_job(v: int) -> NewJob:
    return NewJob(
        spec=ATTACHMENT_RUNS,
        job_id=RUN_IDS[v],
        task_name=attachment_tasks.TASK_NAME,
        concurrency_key=f"attachment:{ATTACHMENT_ID}:v{v}",
        max_attempts=MAX_ATTEMPTS,
        values={"attachment_id": ATTACHMENT_ID, "pipeline_version": v},
    )


def _stored(v: int) -> list[Any]:
    rendered = RenderedVariant(b"x", "0" * 64, 8, 8, "image/webp")
    return [
        attachment_tasks._Stored(
            spec.name, f"attachments/{ATTACHMENT_ID}/v{v}/{spec.name}", "0" * 64, 1, rendered
        )
        for spec in get_pipeline(v).variants
    ]


class AttachmentMachine(RuleBasedStateMachine):
    """Runs of versions 1 and 2 of one attachment, moved by workers (current or zombie
    attempts), the reaper and operators; the attachment's state is the client's view."""

    engine: ClassVar[Engine]

    def __init__(self) -> None:
        super().__init__()
        now = utcnow()
        with self.engine.begin() as conn:
            for table in (
                "job_events",
                "outbox",
                "attachment_variants",
                "attachment_runs",
                "attachments",
            ):
                conn.execute(text(f"DELETE FROM {table}"))
            conn.execute(
                ATTACHMENTS.insert().values(
                    id=ATTACHMENT_ID,
                    content_type="image/png",
                    size=10,
                    sha256="0" * 64,
                    width=8,
                    height=8,
                    display_name="a.png",
                    staging_key=f"staging/{ATTACHMENT_ID}",
                    state=AttachmentState.QUEUED.value,
                    created_at=now,
                    updated_at=now,
                )
            )
            for v in VERSIONS:
                journal.enqueue(conn, _attachment_job(v), now=now, actor="producer")
        self.was_ready = False
        self.published = 0

    def _run(self, v: int) -> journal.Run:
        with self.engine.connect() as conn:
            row = journal.load(conn, ATTACHMENT_RUNS, RUN_IDS[v])
        assert row is not None
        return row

    def _job(self, v: int, token: str) -> Any:
        attempts = self._run(v).attempts
        attempt = attempts if token == "current" else max(attempts - 1, 1)
        run = self._run(v)
        # A zombie holds an older attempt under its own claim's token, as does a worker of
        # a run nobody claimed yet: tokens nobody holds now.
        claim_token = (run.claim_token if token == "current" else None) or uuid.uuid4()
        row = replace(run, attempts=attempt, claim_token=claim_token)
        ctx = RunContext(
            engine=self.engine,
            spec=ATTACHMENT_RUNS,
            row=row,
            worker="chaos",
            heartbeat=Heartbeat(
                self.engine, ATTACHMENT_RUNS, RUN_IDS[v], attempt, 60.0, 3600.0, token=claim_token
            ),
        )
        return attachment_tasks._Job(ctx, ATTACHMENT_ID, v)

    versions = st.sampled_from(VERSIONS)
    tokens = st.sampled_from(["current", "current", "zombie"])

    @rule(v=versions)
    def claim(self, v: int) -> None:
        with self.engine.begin() as conn:
            attempts = self._run(v).attempts
            journal.claim(
                conn, ATTACHMENT_RUNS, RUN_IDS[v], attempts + 1, worker="chaos", now=utcnow()
            )

    @rule(v=versions, token=tokens)
    def worker_starts_processing(self, v: int, token: str) -> None:
        attachment_tasks._mark_processing(self._job(v, token))

    @rule(v=versions, token=tokens, permanent=st.booleans())
    def worker_records_a_failure(self, v: int, token: str, permanent: bool) -> None:
        job = self._job(v, token)
        if permanent:
            attachment_tasks._record(
                job,
                (AttachmentState.QUEUED, AttachmentState.PROCESSING),
                state=AttachmentState.FAILED.value,
                error_code="bad",
            )
            with self.engine.begin() as conn:
                journal.fail(
                    conn,
                    ATTACHMENT_RUNS,
                    RUN_IDS[v],
                    job.ctx.attempt,
                    token=job.ctx.token,
                    outcome=Outcome.PERMANENT,
                    error="bad",
                    actor="chaos",
                    now=utcnow(),
                )
        else:
            attachment_tasks._record(
                job, (AttachmentState.PROCESSING,), state=AttachmentState.QUEUED.value
            )
            now = utcnow()
            with self.engine.begin() as conn:
                journal.requeue(
                    conn,
                    ATTACHMENT_RUNS,
                    job.ctx.row,
                    retry_at=now,
                    error="later",
                    transition=Transition.RETRY,
                    actor="chaos",
                    now=now,
                )

    @rule(v=versions, token=tokens)
    def worker_publishes(self, v: int, token: str) -> None:
        job = self._job(v, token)
        with contextlib.suppress(LeaseLost):
            attachment_tasks._commit(job, _stored(v), f"attachments/{ATTACHMENT_ID}/original.png")

    @rule(v=versions, ending=st.sampled_from(["publish", "permanent", "transient", "dies"]))
    def a_worker_runs_an_attempt(self, v: int, ending: str) -> None:
        """The whole attempt of a healthy worker: claim, processing, then its ending."""
        self.claim(v)
        self.worker_starts_processing(v, "current")
        if ending == "publish":
            self.worker_publishes(v, "current")
        elif ending != "dies":
            self.worker_records_a_failure(v, "current", permanent=ending == "permanent")

    @rule()
    def reaper_pass(self) -> None:
        with self.engine.begin() as conn:
            reap_pass(conn, ATTACHMENT_RUNS, utcnow())

    @rule(v=versions)
    def operator_cancels(self, v: int) -> None:
        with self.engine.begin() as conn:
            journal.cancel(
                conn,
                ATTACHMENT_RUNS,
                RUN_IDS[v],
                attempts=self._run(v).attempts,
                actor="operator:chaos",
                reason="cancel",
                now=utcnow(),
            )

    @rule(v=versions, rerun=st.booleans())
    def operator_replays(self, v: int, rerun: bool) -> None:
        run = self._run(v)
        if run.state not in TERMINAL_STATES or (not rerun and run.state != State.FAILED):
            return
        with self.engine.begin() as conn, contextlib.suppress(KeyBusy):
            journal.reopen(
                conn,
                ATTACHMENT_RUNS,
                RUN_IDS[v],
                from_state=State(run.state),
                attempts=run.attempts,
                budget=REPLAY_BUDGET,
                transition=Transition.RERUN if rerun else Transition.REPLAY,
                now=utcnow(),
                actor="operator:chaos",
                reason="again",
            )

    @rule(v=versions, transition=st.sampled_from(list(Transition)))
    def any_mirrored_change(self, v: int, transition: Transition) -> None:
        """The mirror hook called for any transition of either run, whatever the runs say."""
        with self.engine.begin() as conn:
            mirror_run_change(
                conn, transition, [{"job_id": RUN_IDS[v], "attachment_id": ATTACHMENT_ID}]
            )

    @invariant()
    def ready_never_regresses(self) -> None:
        with self.engine.connect() as conn:
            row = (
                conn.execute(select(ATTACHMENTS).where(ATTACHMENTS.c.id == ATTACHMENT_ID))
                .mappings()
                .one()
            )
            succeeded = conn.execute(
                select(func.count())
                .select_from(EVENTS)
                .where(EVENTS.c.module == ATTACHMENT_RUNS.module, EVENTS.c.transition == "succeed")
            ).scalar_one()
            runs = ATTACHMENT_RUNS.table
            succeeded += conn.execute(
                select(func.count()).select_from(runs).where(carries_success(runs))
            ).scalar_one()
        if self.was_ready:
            assert row["state"] == AttachmentState.READY, row
        published = row["published_version"] or 0
        assert published >= self.published, "published_version went down"
        if row["state"] == AttachmentState.READY:
            assert row["original_key"] is not None
            assert published >= 1
            # Ready only through a run's fenced finish.
            assert succeeded >= 1
        if currently_in_test_context():  # also called directly by the test below
            event(f"attachment {row['state']} v{published}" + (" (was ready)" * self.was_ready))
        self.was_ready = row["state"] == AttachmentState.READY
        self.published = published


def test_an_attachment_once_ready_stays_ready(pg: Engine) -> None:
    machine = type("BoundAttachmentMachine", (AttachmentMachine,), {"engine": pg})
    run_state_machine_as_test(
        machine,
        settings=settings(MACHINE_SETTINGS, stateful_step_count=25),
    )


@pytest.mark.parametrize("transition", list(Transition))
def test_the_mirror_never_takes_ready_back(pg: Engine, transition: Transition) -> None:
    """Each mirrored transition, applied to a ready attachment, leaves it ready."""
    machine = type("BoundAttachmentMachine", (AttachmentMachine,), {"engine": pg})
    m = machine()
    m.claim(1)
    m.worker_publishes(1, "current")
    m.ready_never_regresses()
    assert m.was_ready
    m.any_mirrored_change(1, transition)
    m.ready_never_regresses()
    m.any_mirrored_change(2, transition)
    m.ready_never_regresses()
