"""The test kit a user's suite gets as the ``jobsapp`` fixture (jobsapp/testing/plugin.py).

It runs the real lifecycle, not a mock of it: jobs are enqueued through the journal and its
outbox, and ``drain`` runs each published message as a worker would (Celery's tracer, the
claim with its fence, the finish, retries, workflows' next steps), in this process, one
message at a time. The journal is the embedded default's SQLite (or the database the
environment names), emptied before each test, and the broker's queues are purged with it.

Time is the kit's: ``advance(seconds)`` moves its clock on, so a retry's backoff, a
countdown or an eta runs when the test says the time has come, never after a sleep. The
journal keeps every due time on the database's clock, so the kit moves those times back
by what it advanced (the queued runs' ``next_retry_at`` and ``expires_at``, the waiting
outbox rows' ``available_at``) and runs the relay's pass, which publishes what became
due, as beat would; a message already in the broker with a countdown is held back by
``drain`` until the kit's clock passes its eta, as a worker holds an ETA message.
"""

from __future__ import annotations

import math
import socket
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import Celery
from celery.app.trace import build_tracer
from sqlalchemy import Column, Connection, Engine, Table, delete, inspect, select, update

from jobsapp.db import get_engine
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.celery_api.handle import JobHandle
from jobsapp.lifecycle.journal import EnqueueOutcome, registry
from jobsapp.lifecycle.journal.key_slots import PARKED
from jobsapp.lifecycle.journal.tables import Base
from jobsapp.lifecycle.rules.message import task_id_for
from jobsapp.lifecycle.rules.results import decoded
from jobsapp.lifecycle.transport import outbox
from jobsapp.lifecycle.worker.celery_view import started_no_work
from jobsapp.maintenance import lease, relay, slot_sweep

# What drain reports, by the state the job is in after the attempt it ran.
_SAID = {"succeeded": "succeeded", "failed": "failed", "queued": "retried", "running": "running"}
# How far an enqueued job's due time may be from the ``eta`` a test expects: the test
# reads the clock a moment after the enqueue did.
ETA_TOLERANCE = timedelta(seconds=1)
# ``drain(with_scheduled=True)`` moves the clock this much past the next due time, so a
# float's rounding never leaves the message a microsecond early.
_PAST_DUE = timedelta(milliseconds=10)
# The relay as the kit runs it: a row is published the moment it is due (no producer
# of the test's is still about to publish it).
_RELAY = relay.RelayConfig(grace=timedelta(0))
# A bound on ``perform``'s attempts: a job that keeps asking for more is a test's fault.
_MAX_ATTEMPTS = 100
_FIELDS = ("args", "kwargs", "key", "queue", "priority", "eta")


def relay_tick(app: Celery, engine: Engine) -> dict[str, int]:
    """One tick of beat's relay task, the key slots' net first (maintenance/beat_tasks.py),
    publishing a row the moment it is due; the fast path's pending publish marks are
    written first, so nothing it sent is taken for unpublished."""
    outbox.MARKER.flush()
    freed = slot_sweep.run_once(app, engine)
    return freed | relay.run_once(app, engine, _RELAY)


@dataclass(frozen=True)
class Run:
    """A run row as a test reads it."""

    job_id: Any
    task: str
    state: str
    outcome: str | None
    attempts: int
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    key: str
    queue: str | None
    priority: int | None
    last_error: str | None
    result: Any
    # When its next attempt is due, on the kit's clock (None: whenever a worker takes it).
    eta: datetime | None = None
    # Queued in its limited key's line, holding no slot yet (docs/flow-control.md).
    waiting: bool = False
    # The stored traceback of its last failed attempt (scrubbed, as Flower shows it).
    error: str | None = None
    # When the row was last written (the database's time, which ``advance`` leaves alone).
    updated_at: datetime | None = None

    def describe(self) -> str:
        """One line a failure message shows."""
        due = "" if self.eta is None else f" eta={self.eta.isoformat()}"
        line = "waiting for a slot of its key" if self.waiting else self.state
        return (
            f"args={self.args!r} kwargs={self.kwargs!r} key={self.key!r} queue={self.queue!r} "
            f"priority={self.priority!r}{due}: {line}"
        )


class Kit:
    """Assertions on what was enqueued, and the jobs run here through the lifecycle."""

    def __init__(self, app: Celery, engine: Engine | None = None) -> None:
        self.app = app
        self.engine = engine or get_engine()
        self._advanced = timedelta(0)

    # --- isolation ------------------------------------------------------------------

    def reset(self) -> None:
        """Empty the journal and the broker's queues, and set the clock back: nothing
        leaks between tests."""
        queues = self._queues()
        present = set(inspect(self.engine).get_table_names())
        with self.engine.begin() as conn:
            for table in reversed(Base.metadata.sorted_tables):
                if table.name in present:
                    conn.execute(delete(table))
        with self.app.connection_for_write() as conn:
            channel: Any = conn.default_channel
            for queue in queues:
                channel.queue_purge(queue)
        self._advanced = timedelta(0)

    def _queues(self, queue: str | None = None) -> set[str]:
        """``queue``, or the app's default queue, every queue a job was sent to and every
        queue the app routed a message to in this process: a plain task's, chosen by its
        call or by ``task_routes``, is named by no outbox row (Celery adds it to the app's
        queues), and its message was left for the next test."""
        if queue is not None:
            return {queue}
        known = {str(self.app.conf.task_default_queue), *self.app.amqp.queues}
        named = select(journal.OUTBOX.c.queue).where(journal.OUTBOX.c.queue.is_not(None))
        with self.engine.connect() as conn:
            if not inspect(conn).has_table(journal.OUTBOX.name):
                return known
            return known | set(conn.execute(named.distinct()).scalars())

    # --- the clock ------------------------------------------------------------------

    def now(self) -> datetime:
        """The kit's clock: the database's, plus what ``advance`` moved it on."""
        with self.engine.connect() as conn:
            return lease.database_now(conn) + self._advanced

    def advance(self, seconds: float | timedelta) -> dict[str, int]:
        """Move the kit's clock ``seconds`` (or a ``timedelta``) on: a retry, a countdown or
        an eta due by then runs at the next ``drain()``, and a queued job's expiry comes as
        much nearer. The relay's pass then publishes what became due (its counts are
        returned)."""
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
        if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"advance takes a number of seconds >= 0, not {seconds!r}")
        step = timedelta(seconds=seconds)
        with self.engine.begin() as conn:
            for spec in registry.all_tables():
                runs = spec.table
                _move_back(conn, runs, runs.c.next_retry_at, step, runs.c.state == "queued")
                active = runs.c.state.in_(("queued", "running"))
                _move_back(conn, runs, runs.c.expires_at, step, active)
            box = journal.OUTBOX
            waiting = (box.c.published_at.is_(None), box.c.dead_at.is_(None))
            _move_back(conn, box, box.c.available_at, step, *waiting)
        self._advanced += step
        return self._relay()

    def _relay(self) -> dict[str, int]:
        return relay_tick(self.app, self.engine)

    # --- what was enqueued ----------------------------------------------------------

    def _lifecycle_task(self, task: Any) -> Any:
        """``task``, or the task of the app registered under that name; anything else (a
        plain Celery task, a signature) is refused naming what the kit reads."""
        found = self.app.tasks.get(task) if isinstance(task, str) else task
        if found is None or not hasattr(found, "run_table"):
            raise TypeError(
                f"{task!r} is not a lifecycle task (declared with lifecycle_task) of this "
                "app: the kit's assertions read lifecycle tasks' runs in the journal; pass "
                "the task or its name, its arguments as args=/kwargs= (drain() runs a plain "
                "task's messages too)"
            )
        return found

    def runs(self, task: Any) -> list[Run]:
        """Every run of ``task`` (a lifecycle task or its name), oldest first."""
        task = self._lifecycle_task(task)
        spec = task.run_table
        table = spec.table
        stmt = select(table).where(table.c.task_name == task.name).order_by(table.c.created_at)
        with self.engine.connect() as conn:
            return [self._run(conn, spec, dict(row)) for row in conn.execute(stmt).mappings()]

    def _run(self, conn: Connection, spec: registry.RunTable, row: dict[str, Any]) -> Run:
        params = decoded(row.get(spec.params_column) or {}) if spec.params_column else {}
        due = row["next_retry_at"]
        error = None
        if row["last_error"] is not None:
            failure = journal.attempt_failure(conn, spec, row["job_id"], int(row["attempts"]))
            error = None if failure is None else failure.traceback
        return Run(
            job_id=row["job_id"],
            task=row["task_name"],
            state=row["state"],
            outcome=row["outcome"],
            attempts=int(row["attempts"]),
            args=tuple(params.get("args", ())),
            kwargs=dict(params.get("kwargs", {})),
            key=row["concurrency_key"],
            queue=row.get("queue"),
            priority=row.get("priority"),
            last_error=row["last_error"],
            result=decoded(row["result"]),
            eta=None if due is None or due == PARKED else due + self._advanced,
            waiting=due == PARKED,
            error=error,
            updated_at=row["updated_at"],
        )

    def enqueued(self, task: Any, **subset: Any) -> list[JobHandle]:
        """Handles of the queued jobs of ``task`` matching ``subset`` (``args``, ``kwargs``,
        ``key``, ``queue``, ``priority``, ``eta``, ``countdown``): a job matches when each
        given field equals; an ``eta`` (or ``countdown``, seconds from the kit's clock now,
        less up to the time since the job was written) within ``ETA_TOLERANCE`` of the job's
        due time."""
        task = self._lifecycle_task(task)
        return [
            JobHandle(
                run.job_id, EnqueueOutcome.DUPLICATE, task.run_table, task=task.name, app=self.app
            )
            for run in self._queued(task, self._wanted(subset))
        ]

    def _queued(self, task: Any, wanted: Mapping[str, Any]) -> list[Run]:
        return [r for r in self.runs(task) if r.state == "queued" and _matches(r, wanted)]

    def _wanted(self, subset: Mapping[str, Any]) -> dict[str, Any]:
        """``subset`` checked, with a countdown turned into the eta it means now."""
        unknown = set(subset) - {*_FIELDS, "countdown"}
        if unknown:
            raise TypeError(
                f"assert_enqueued matches on {[*_FIELDS, 'countdown']}, not {sorted(unknown)}"
            )
        if "countdown" in subset and "eta" in subset:
            raise TypeError("assert_enqueued takes an eta or a countdown, not both")
        wanted = dict(subset)
        if "countdown" in wanted:
            with self.engine.connect() as conn:
                read_at = lease.database_now(conn)
            due = read_at + self._advanced + timedelta(seconds=wanted["countdown"])
            wanted["countdown"] = _Countdown(due, read_at)
        if isinstance(wanted.get("eta"), datetime):
            wanted["eta"] = _aware(wanted["eta"])
        return wanted

    def assert_enqueued(self, task: Any, **subset: Any) -> None:
        task = self._lifecycle_task(task)
        wanted = self._wanted(subset)
        if not self._queued(task, wanted):
            raise AssertionError(
                f"no queued {task.name} job with {_shown(subset, wanted)}\n{self._listing(task)}"
            )

    def refute_enqueued(self, task: Any, **subset: Any) -> None:
        task = self._lifecycle_task(task)
        wanted = self._wanted(subset)
        found = self._queued(task, wanted)
        if found:
            lines = "".join(f"\n  {r.describe()}" for r in found)
            raise AssertionError(
                f"{len(found)} queued {task.name} job(s) with {_shown(subset, wanted)}:{lines}"
            )

    def _listing(self, task: Any) -> str:
        queued = [r for r in self.runs(task) if r.state == "queued"]
        if not queued:
            return f"no {task.name} job is queued"
        lines = "".join(f"\n  {r.describe()}" for r in queued)
        return f"queued {task.name} jobs (the kit's clock: {self.now().isoformat()}):{lines}"

    def assert_succeeded(self, task: Any, **subset: Any) -> list[Run]:
        """The runs of ``task`` matching ``subset``, once each has succeeded; else an
        ``AssertionError`` naming each run that has not, with its stored traceback."""
        task = self._lifecycle_task(task)
        wanted = self._wanted(subset)
        found = [r for r in self.runs(task) if _matches(r, wanted)]
        if not found:
            raise AssertionError(f"no {task.name} run with {_shown(subset, wanted)}")
        unfinished = [r for r in found if r.state != "succeeded"]
        if unfinished:
            told = "\n".join(_failure(r) for r in unfinished)
            raise AssertionError(
                f"{len(unfinished)} of {len(found)} {task.name} runs did not succeed:\n{told}"
            )
        return found

    def outbox(self) -> list[dict[str, Any]]:
        """The outbox rows: what was (or is to be) published, for assertions."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(journal.OUTBOX).order_by(journal.OUTBOX.c.id))
            return [dict(row) for row in rows.mappings()]

    # --- running jobs here ------------------------------------------------------------

    def drain(
        self,
        queue: str | None = None,
        *,
        with_scheduled: bool = False,
        until_empty: bool = True,
        max_messages: int = 1000,
    ) -> Counter[str]:
        """Run every published message that is due on the kit's clock, as a worker would,
        until none is left (a retry or a workflow's next step publishes another, which
        runs too); counts of the attempts by what they ended in: ``succeeded``, ``failed``,
        ``retried``. A message not due yet (a countdown, a retry's backoff) stays until
        ``advance`` moves the clock past it; ``with_scheduled`` moves it there itself.
        ``until_empty=False``: only the messages that were due when it was called."""
        counts: Counter[str] = Counter()
        budget = max_messages
        while budget > 0:
            due, later = self._take_due(queue)
            if not due:
                wait = self._next_due_in(later) if with_scheduled else None
                if wait is None:
                    return counts
                self.advance(wait)
                budget -= 1
                continue
            for message in due:
                said = self._run_message(message)
                if said is not None:
                    counts[said] += 1
            budget -= len(due)
            if not until_empty:
                return counts
        raise AssertionError(f"drain ran {max_messages} messages and the queue is not empty")

    def perform(self, task: Any, *args: Any, **kwargs: Any) -> Run:
        """One job of ``task`` enqueued and run here through the lifecycle, attempt after
        attempt, to its end; its run (outcome, result, stored error). Nothing else runs
        (what the body enqueued stays queued); the clock moves over each backoff, as
        ``drain(with_scheduled=True)`` would move it."""
        task = self._lifecycle_task(task)
        handle = task.apply_async(args, kwargs)
        for _ in range(_MAX_ATTEMPTS):
            run = self._run_of(task, handle.job_id)
            if run is None:
                raise AssertionError(f"{task.name}: no run of job {handle.job_id} ({handle!r})")
            if run.state != "queued":
                return run
            if run.waiting:
                raise AssertionError(f"{task.name}: job {run.job_id} waits for a slot of its key")
            if run.eta is not None and (wait := run.eta - self.now()) > timedelta(0):
                self.advance(wait + _PAST_DUE)
            self._attempt(task, run.job_id, run.attempts + 1)
        raise AssertionError(f"{task.name}: job {handle.job_id} ran {_MAX_ATTEMPTS} attempts")

    def _run_of(self, task: Any, job_id: uuid.UUID) -> Run | None:
        spec = task.run_table
        with self.engine.connect() as conn:
            row = journal.load(conn, spec, job_id)
            return None if row is None else self._run(conn, spec, dict(row.columns))

    def _attempt(self, task: Any, job_id: uuid.UUID, attempt: int) -> None:
        """The message of ``attempt`` as the relay would send it, run here (a copy the
        broker holds is refused by the claim later, as any duplicate)."""
        box = journal.OUTBOX
        with self.engine.connect() as conn:
            row = conn.execute(
                select(box.c.id, box.c.body).where(
                    box.c.module == task.run_table.module,
                    box.c.job_id == job_id,
                    box.c.attempt == attempt,
                )
            ).one()
        self._trace(task, task_id_for(job_id, attempt), (), {**row.body, "outbox_id": row.id})

    def _take_due(self, queue: str | None) -> tuple[list[Any], list[datetime]]:
        """The due messages of the queues, taken off them (acked), in eta order; the
        others are put back, and their etas returned."""
        now = self.now()
        due: list[tuple[datetime, int, Any]] = []
        later: list[datetime] = []
        with self.app.connection_for_read() as conn:
            for name in sorted(self._queues(queue)):
                simple = conn.SimpleQueue(name)
                held = []
                while True:
                    try:
                        held.append(simple.get(block=False))
                    except simple.Empty:
                        break
                for message in held:
                    eta = _eta(message)
                    if eta is not None and eta > now:
                        later.append(eta)
                        message.requeue()
                    else:
                        message.ack()
                        due.append((eta or now, len(due), message))
                simple.close()
        return [message for _, _, message in sorted(due, key=lambda d: d[:2])], later

    def _next_due_in(self, later: Sequence[datetime]) -> timedelta | None:
        """How far the clock must move for the next message to be due: the first of the
        etas in the broker and of the outbox rows waiting for their time."""
        box = journal.OUTBOX
        waiting = select(box.c.available_at).where(
            box.c.published_at.is_(None), box.c.dead_at.is_(None), box.c.available_at != PARKED
        )
        with self.engine.connect() as conn:
            rows: list[datetime] = [at + self._advanced for at in conn.execute(waiting).scalars()]
        times = [*later, *rows]
        if not times:
            return None
        return max(timedelta(0), min(times) - self.now()) + _PAST_DUE

    def _run_message(self, message: Any) -> str | None:
        headers = message.headers
        args, kwargs, _embed = message.payload
        task = self.app.tasks[headers["task"]]
        queue = message.delivery_info.get("routing_key")
        retval = self._trace(task, headers["id"], args, kwargs, queue)
        # A duplicate or early copy the claim refused is no attempt: drain does not count it.
        if started_no_work(retval):
            return None
        return self._state_after(task, kwargs)

    def _trace(
        self,
        task: Any,
        task_id: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        queue: str | None = None,
    ) -> Any:
        """Run one delivery as a worker does (Celery's tracer); what the task returned."""
        trace = build_tracer(task.name, task, app=self.app, eager=False)
        request = delivered(self.app, task_id, "kit", queue=queue)
        return trace(task_id, list(args), dict(kwargs), request)[0]

    def _state_after(self, task: Any, kwargs: Mapping[str, Any]) -> str:
        job_id = kwargs.get("job_id") if isinstance(kwargs, Mapping) else None
        if job_id is None or not hasattr(task, "run_table"):
            return "ran"
        with self.engine.connect() as conn:
            row = journal.load(conn, task.run_table, uuid.UUID(str(job_id)))
        return "not run" if row is None else _SAID.get(row.state, row.state)

    def wait_for(self, task: Any, state: str, timeout: float = 20.0) -> list[Run]:
        """With a real worker (``jobsapp_worker``): the runs of ``task`` once every one of
        them is in ``state``."""
        task = self._lifecycle_task(task)
        deadline = time.monotonic() + timeout
        while True:
            found = self.runs(task)
            if found and all(r.state == state for r in found):
                return found
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{task.name}: not all {state} after {timeout}s: "
                    f"{[(r.state, r.last_error) for r in found]}"
                )
            time.sleep(0.05)


def _move_back(
    conn: Connection, table: Table, column: Column[Any], step: timedelta, *where: Any
) -> None:
    """Each due time of ``column`` (not a parked one) ``step`` earlier, guarded by the
    time read: a row a concurrent writer moved meanwhile keeps that writer's value."""
    keys = list(table.primary_key.columns)
    found = conn.execute(
        select(*keys, column).where(column.is_not(None), column != PARKED, *where)
    ).all()
    for *ids, at in found:
        same_row = [key == value for key, value in zip(keys, ids, strict=True)]
        conn.execute(update(table).where(*same_row, column == at).values({column.name: at - step}))


def _eta(message: Any) -> datetime | None:
    eta = message.headers.get("eta")
    return None if not eta else _aware(datetime.fromisoformat(eta))


def _aware(at: datetime) -> datetime:
    """A naive time is UTC, as jobsapp's ``apply_async(eta=...)`` reads one."""
    return at if at.tzinfo else at.replace(tzinfo=UTC)


@dataclass(frozen=True)
class _Countdown:
    """A countdown asked for: seconds from the kit's clock now, to within the time that
    passed since the job's row was written (a slow test still matches the countdown the job
    was given, however long its assertion took to come)."""

    due: datetime  # on the kit's clock
    read_at: datetime  # the database's time when the test asked

    def matches(self, run: Run) -> bool:
        if run.eta is None or run.updated_at is None:
            return False
        since_written = max(self.read_at - _aware(run.updated_at), timedelta(0))
        early = self.due - run.eta
        return -ETA_TOLERANCE <= early <= since_written + ETA_TOLERANCE


def _matches(run: Run, wanted: Mapping[str, Any]) -> bool:
    for name, value in wanted.items():
        have = getattr(run, name, None)
        if name == "countdown":
            if not value.matches(run):
                return False
        elif name == "eta":
            if (have is None) != (value is None):
                return False
            if value is not None and abs(have - value) > ETA_TOLERANCE:
                return False
        elif have != (tuple(value) if name == "args" else value):
            return False
    return True


def _shown(subset: Mapping[str, Any], wanted: Mapping[str, Any]) -> str:
    """What a test asked for, a time as text and a countdown with the eta it meant."""
    shown = []
    for name, value in subset.items():
        if name == "countdown":
            shown.append(f"countdown={value!r} (eta {wanted['countdown'].due.isoformat()})")
        elif name == "eta" and value is not None:
            shown.append(f"eta={wanted['eta'].isoformat()}")
        else:
            shown.append(f"{name}={value!r}")
    return ", ".join(shown) or "any arguments"


def _failure(run: Run) -> str:
    """A run that did not succeed, as a failure message shows it: its state, its error
    and the stored traceback of its last failed attempt."""
    head = (
        f"- job {run.job_id} {run.describe()}, outcome {run.outcome}, "
        f"attempts {run.attempts}: {run.last_error}"
    )
    if not run.error:
        return head
    body = "\n".join(f"    {line}" for line in run.error.rstrip().splitlines())
    return f"{head}\n{body}"


def delivered(app: Celery, task_id: str, host: str, *, queue: str | None = None) -> dict[str, Any]:
    """The request Celery's tracer gets for a message a worker on ``host`` took from
    ``queue`` (the app's default queue when None)."""
    return {
        "id": task_id,
        "hostname": f"{host}@{socket.gethostname()}",
        "is_eager": False,
        "delivery_info": {
            "routing_key": queue or str(app.conf.task_default_queue),
            "exchange": "",
            "priority": 0,
            "redelivered": False,
        },
    }
