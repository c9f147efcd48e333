"""Celery habits against real Redis, Postgres and workers: queues, get(), arguments.

A worker consuming only queue B is a real ``celery -A jobsapp worker -Q B`` subprocess;
the other habits use the in-process worker of tests/conftest.py.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import celery
import celery.exceptions
import pytest
import redis
from celery import Celery
from celery.result import AsyncResult
from celery.signals import before_task_publish, task_postrun
from kombu import Exchange, Queue
from sqlalchemy import Engine, func, select

from jobsapp.attachments.tasks import process_attachment
from jobsapp.celery_app import app
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.journal import OUTBOX, outbox_queries
from jobsapp.lifecycle.journal.tables import JobRun
from jobsapp.lifecycle.transport import publisher
from jobsapp.maintenance import relay
from jobsapp.settings import get_settings
from tests.support import habit_tasks, tasks
from tests.support.env import service
from tests.support.journal_view import outbox_rows, run_row
from tests.support.procs import BIN, WORKER_FLAGS, Launcher, launching, ready
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(120)

UNCLAIMED_AFTER = 0.5


def _count(engine: Engine, table: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())  # type: ignore[arg-type]


def _relayed(db: Engine, handle: AsyncResult) -> bool:
    """Whether ``handle`` is ready, after a pass of beat's relay over what is due."""
    relay.run_once(app, db, relay.RelayConfig(grace=timedelta(0)))
    return bool(handle.ready())


def _relay_counts(engine: Engine) -> tuple[int, int]:
    """The relay's unclaimed and unknown-task totals (they outlive a test's journal)."""
    with engine.connect() as conn:
        totals = outbox_queries.counters(conn)
    return totals.get(relay.UNCLAIMED, 0), totals.get(relay.UNKNOWN_TASK, 0)


@pytest.fixture
def worker_on_b(pg: Engine, redis_clean: None, tmp_path: Path) -> Iterator[Launcher]:
    """A launcher for workers of this session's services, with queue B emptied."""
    redis.Redis.from_url(service("JOBSAPP_TEST_REDIS_URL")).delete(habit_tasks.QUEUE_B)
    env = {
        **os.environ,
        "JOBSAPP_IMPORTS": "tests.support.tasks,tests.support.habit_tasks",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    with launching(env, tmp_path) as launcher:
        yield launcher


def test_a_worker_of_queue_b_runs_jobs_sent_to_b_with_their_retry_and_a_relay_republish(
    worker_on_b: Launcher, pg: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBSAPP_UNCLAIMED_AFTER", str(UNCLAIMED_AFTER))
    get_settings.cache_clear()
    broker = redis.Redis.from_url(service("JOBSAPP_TEST_REDIS_URL"))
    token = uuid.uuid4().hex[:8]
    # Lost: published to B before any worker listens, then dropped by the broker.
    lost = tasks.echo.apply_async(kwargs={"token": f"{token}-lost"}, queue=habit_tasks.QUEUE_B)
    assert broker.delete(habit_tasks.QUEUE_B) == 1
    worker = worker_on_b.start(
        "worker-b",
        [
            str(BIN / "celery"),
            "-A",
            "jobsapp",
            "worker",
            *WORKER_FLAGS,
            "-Q",
            habit_tasks.QUEUE_B,
            "-n",
            f"b-{token}@%h",
        ],
    )
    ready(worker, timeout=60)
    cfg = relay.RelayConfig(unclaimed_after=timedelta(seconds=UNCLAIMED_AFTER))
    eventually(lambda: relay.run_once(app, pg, cfg)["republished"] == 1)
    # Sent with a queue, with a priority, and to a task whose own queue is B; the first
    # fails once, so its retry must reach B as well.
    retried = tasks.flaky.apply_async(
        kwargs={"token": f"{token}-flaky", "fail_times": 1, "secret": "s"},
        queue=habit_tasks.QUEUE_B,
    )
    urgent = tasks.echo.apply_async(
        kwargs={"token": f"{token}-urgent"}, queue=habit_tasks.QUEUE_B, priority=9
    )
    own = habit_tasks.on_b.delay(f"{token}-own", 1)
    for job in (lost, retried, urgent, own):
        job.get(timeout=60)
    assert run_row(pg, retried.job_id)["attempts"] == 2
    assert run_row(pg, own.job_id)["attempts"] == 2
    queues = {r["queue"] for h in (lost, retried, own) for r in outbox_rows(pg, h.job_id)}
    assert queues == {habit_tasks.QUEUE_B}
    assert tasks.calls(f"{token}-lost") == 1


def test_the_reaper_requeues_a_run_to_the_queue_its_producer_chose(db: Engine) -> None:
    job = tasks.echo.new_job((), {"token": "reaped"}, None)
    job = replace(job, queue="habits-reaped")
    with db.begin() as conn:
        journal.enqueue(conn, job, actor="producer")
    spec = job.spec
    with db.begin() as conn:
        claimed = journal.claim(conn, spec, job.job_id, 1, worker="w", now=None)
        assert claimed is not None
    later = datetime.now(UTC) + timedelta(hours=1)
    with db.begin() as conn:
        stale = journal.find_stale(conn, spec, cutoff=later, limit=10)
        reaped = journal.reap(
            conn,
            spec,
            stale,
            requeue_them=True,
            cutoff=later,
            reason="stale",
            now=datetime.now(UTC),
        )
    assert [r.job_id for r in reaped] == [job.job_id]
    assert [(r["attempt"], r["queue"]) for r in outbox_rows(db, job.job_id)] == [
        (1, "habits-reaped"),
        (2, "habits-reaped"),
    ]


def test_get_returns_on_success_raises_the_stored_error_on_failure_and_times_out(
    worker: object, db: Engine
) -> None:
    token = uuid.uuid4().hex[:8]
    done = tasks.echo.delay(f"{token}-ok")
    assert done.get(timeout=30) is None
    assert tasks.echo.AsyncResult(done.id).successful()

    doomed = tasks.doomed.delay(f"{token}-doomed")
    # The body's own exception, as Celery's backend rebuilds it; the journal's detail on it.
    with pytest.raises(ValueError, match="this never works") as failed:
        doomed.get(timeout=30)
    assert failed.value.outcome == "exhausted"  # type: ignore[attr-defined]
    # As Celery's get(propagate=False): the failure is returned, not raised.
    assert isinstance(tasks.doomed.AsyncResult(doomed.id).get(propagate=False), ValueError)

    later = tasks.echo.apply_async(args=(f"{token}-later",), countdown=3600)
    with pytest.raises(celery.exceptions.TimeoutError):
        later.get(timeout=0.5)


def test_get_raises_the_bodys_exception_with_its_arguments_as_celerys_json_keeps_them(
    worker: object, db: Engine
) -> None:
    carrying = tasks.doomed_carrying.delay(uuid.uuid4().hex[:8], False)
    nan_only = tasks.doomed_carrying.delay(uuid.uuid4().hex[:8], True)
    # A NaN has no JSON number (Postgres's json refused the failure's row, and the run
    # stayed running): its repr, as Celery keeps what its JSON cannot hold.
    expected = ((carrying, ({"field": "email", "code": 7}, "nan")), (nan_only, ("nan",)))
    for handle, args in expected:
        with pytest.raises(ValueError, match="nan") as failed:
            handle.get(timeout=30)
        assert failed.value.args == args
        assert run_row(db, handle.job_id)["state"] == "failed"


def test_send_tasks_link_and_link_error_run_once_after_the_attempt_that_ends_the_job(
    worker: object, db: Engine
) -> None:
    # A service that does not import the task sends it by name with its callbacks; Celery's
    # tracer sends them (they were dropped: apply_async refused the root_id and parent_id
    # it names them with). The first attempt fails here: the retry, jobsapp's own message,
    # carries no callbacks, so the run keeps them.
    t = uuid.uuid4().hex[:8]
    flaky = app.send_task(
        tasks.flaky.name, (f"{t}-flaky", 1, "s3cr3t"), link=tasks.echo.si(f"{t}-linked")
    )
    # An old-style errback is given the failed task's id: the job's, which the caller holds
    # (the failing attempt's own is a retry's, which no AsyncResult names).
    doomed = app.send_task(tasks.doomed.name, (f"{t}-doomed",), link_error=tasks.echo.s())
    assert flaky.get(timeout=30) is None
    with pytest.raises(ValueError, match="this never works"):
        doomed.get(timeout=30)
    eventually(lambda: tasks.calls(f"{t}-linked") and tasks.calls(doomed.id), timeout=30)

    # The same message again (a redelivery): refused as a copy, it sends no callback.
    delivered: list[str] = []

    def ended(task_id: str, **_: Any) -> None:
        delivered.append(task_id)

    task_postrun.connect(ended, weak=False)
    try:
        copy = (f"{t}-flaky", 1, "s3cr3t")
        app.send_task(tasks.flaky.name, copy, task_id=flaky.id, link=tasks.echo.si(f"{t}-linked"))
        eventually(lambda: flaky.id in delivered, timeout=30)
    finally:
        task_postrun.disconnect(ended)
    # Celery's tracer sends a link before task_postrun: a second would be in the journal.
    with db.connect() as conn:
        echoes = conn.execute(select(JobRun.params).where(JobRun.task_name == tasks.echo.name))
        linked = [p for (p,) in echoes if p["args"] == [f"{t}-linked"]]
    assert len(linked) == 1
    ran = [tasks.calls(f"{t}-{n}") for n in ("flaky", "doomed", "linked")]
    assert (ran, tasks.calls(doomed.id)) == ([2, 2, 1], 1)


def test_send_task_of_a_call_already_expired_answers_revoked_as_celerys(
    worker: object, db: Engine
) -> None:
    # The worker discards the message unadopted: there was no run, and the id read
    # PENDING for good.
    t = uuid.uuid4().hex[:8]
    gone = app.send_task(tasks.echo.name, (t,), expires=datetime.now(UTC) - timedelta(seconds=30))

    with pytest.raises(celery.exceptions.TaskRevokedError):
        gone.get(timeout=30)
    assert gone.state == "REVOKED"
    assert tasks.calls(t) == 0
    assert run_row(db, uuid.UUID(gone.id))["outcome"] == "expired"


def test_a_call_from_a_body_sees_its_sender_as_celery_has_it_when_the_relay_publishes_it(
    worker: object, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Celery's send_task stamps the calling task's root_id and parent_id on the message; a
    # broker that timed out leaves the message to beat's relay, where no task is calling.
    monkeypatch.setattr(publisher, "fast_path_open", lambda: False)
    when_due = relay.RelayConfig(grace=timedelta(0))

    def relayed(handle: AsyncResult) -> bool:
        relay.run_once(app, db, when_due)
        return bool(handle.ready())

    # What Flower shows of a message (its task-received event) is what its headers say.
    seen: dict[str, tuple[str, str]] = {}

    def published(sender: str, headers: dict[str, Any], **_: Any) -> None:
        if sender == tasks.lineage_seen.name:
            seen[headers["id"]] = (headers["root_id"], headers["parent_id"])

    before_task_publish.connect(published, weak=False)
    try:
        sender = tasks.sends_lineage.delay()
        eventually(lambda: relayed(sender), timeout=30, interval=0.2)
        sent = tasks.lineage_seen.AsyncResult(sender.get(timeout=5))
        eventually(lambda: relayed(sent), timeout=30, interval=0.2)
    finally:
        before_task_publish.disconnect(published)

    assert sent.get(timeout=5) == [sender.id, sender.id]
    assert seen[sent.id] == (sender.id, sender.id)


@pytest.mark.parametrize("given", [("root-r", "parent-p"), (None, "parent-p")])
@pytest.mark.parametrize("by_relay", [False, True])
def test_a_calls_own_root_and_parent_are_in_its_message_whoever_publishes_it_as_celerys(
    worker: object,
    db: Engine,
    monkeypatch: pytest.MonkeyPatch,
    given: tuple[str | None, str | None],
    by_relay: bool,
) -> None:
    # A service continuing a trace or a workflow names them from outside any task: the
    # caller's fast path sent the message as a root of its own, and the relay dropped a
    # parent named without a root.
    if by_relay:
        monkeypatch.setattr(publisher, "fast_path_open", lambda: False)
    lineage = dict(zip(("root_id", "parent_id"), given, strict=True))
    bare = Celery("bare", broker="memory://", set_as_current=False)

    @bare.task(name="bare.lineage_seen", bind=True)
    def bare_lineage(self: Any) -> None:  # published here, never run
        del self

    seen: dict[str, tuple[str, str]] = {}

    def published(sender: str, headers: dict[str, Any], **_: Any) -> None:
        seen[headers["id"]] = (headers["root_id"], headers["parent_id"])

    before_task_publish.connect(published, weak=False)
    try:
        theirs = bare_lineage.apply_async(**lineage)
        ours = tasks.lineage_seen.apply_async(**lineage)
        if by_relay:
            eventually(lambda: _relayed(db, ours), timeout=30, interval=0.2)
        assert ours.get(timeout=30) == [given[0] or ours.id, given[1]]
    finally:
        before_task_publish.disconnect(published)

    assert seen[theirs.id] == (given[0] or theirs.id, given[1])
    assert seen[ours.id] == (given[0] or ours.id, given[1])


# What a service continuing a trace or a workflow names from outside any task: a root and a
# parent, a root alone, a parent alone.
_GIVEN_LINEAGES = [("root-r", "parent-p"), ("root-r", None), (None, "parent-p")]


def _sent_with(shape: str, first: Any, then: Any, lineage: dict[str, Any]) -> tuple[Any, list[Any]]:
    """``shape`` of ``first`` (then ``then``) applied with ``lineage``: its result, and the
    results of its first tasks (those the caller's ``apply_async`` sends)."""
    if shape == "link":
        r = first.apply_async(link=then.si(), **lineage)
        return r, [r]
    if shape == "chain":
        r = celery.chain(first.s(), then.s()).apply_async(**lineage)
        return r, [r.parent]
    if shape == "group":
        r = celery.group(first.s(), first.s()).apply_async(**lineage)
        return r, list(r.results)
    r = celery.chord([first.s(), first.s()], then.s()).apply_async(**lineage)
    return r, list(r.parent.results)


def _as_seen(own: str, root: str | None, parent: str | None) -> list[str | None]:
    return ["own" if root == own else root, parent]


@pytest.mark.parametrize("shape", ["link", "chain", "group", "chord"])
@pytest.mark.parametrize("by_relay", [False, True])
def test_a_link_or_canvas_given_a_root_and_parent_starts_with_them_as_celerys(
    worker: object, db: Engine, monkeypatch: pytest.MonkeyPatch, shape: str, by_relay: bool
) -> None:
    # apply_async(link=...) lost the caller's root and parent (the call becomes a
    # workflow); a canvas's first messages named themselves their roots, with no parent.
    if by_relay:
        monkeypatch.setattr(publisher, "fast_path_open", lambda: False)
    bare = Celery("bare", broker="memory://", backend="cache+memory://", set_as_current=False)

    @bare.task(name="bare.lineage_seen", bind=True)
    def bare_lineage(self: Any, *_: Any) -> None:  # published here, never run
        del self

    seen: dict[str, tuple[str, str]] = {}

    def published(sender: str, headers: dict[str, Any], **_: Any) -> None:
        seen[headers["id"]] = (headers["root_id"], headers["parent_id"])

    theirs, ours, bodies = [], [], []
    before_task_publish.connect(published, weak=False)
    try:
        for given in _GIVEN_LINEAGES:
            lineage = dict(zip(("root_id", "parent_id"), given, strict=True))
            _, firsts = _sent_with(shape, bare_lineage, bare_lineage, lineage)
            theirs.append([_as_seen(f.id, *seen[f.id]) for f in firsts])
            whole, firsts = _sent_with(shape, tasks.lineage_seen, tasks.lineage_seen, lineage)
            if by_relay:
                eventually(partial(_relayed, db, whole), timeout=30, interval=0.2)
            ours.append([_as_seen(f.id, *seen[f.id]) for f in firsts])
            bodies.append([_as_seen(f.id, *f.get(timeout=30)) for f in firsts])
    finally:
        before_task_publish.disconnect(published)

    assert ours == theirs
    assert bodies == theirs  # a Celery body sees what its message's headers say


def test_a_handle_speaks_celerys_state_names_like_an_async_result(
    worker: object, db: Engine
) -> None:
    bare = celery.Celery("bare", broker="memory://")

    @bare.task
    def ok() -> int:
        return 1

    @bare.task
    def broken() -> None:
        raise ValueError("this never works")

    token = uuid.uuid4().hex[:8]
    done, doomed = tasks.echo.delay(f"{token}-ok"), tasks.doomed.delay(f"{token}-doomed")
    done.settled(timeout=30)
    doomed.settled(timeout=30)

    assert (done.state, ok.apply().state) == ("SUCCESS", "SUCCESS")
    assert (doomed.state, broken.apply().state) == ("FAILURE", "FAILURE")
    assert (done.status, doomed.status) == ("SUCCESS", "FAILURE")
    # The journal keeps its own names.
    assert (done.journal_state, doomed.journal_state) == ("succeeded", "failed")
    assert tasks.echo.AsyncResult(str(uuid.uuid4())).state == "PENDING"


def test_apply_runs_a_retry_at_once_as_celerys_eager_call_does(db: Engine) -> None:
    """``task.apply()`` (and ``task_always_eager``) of a body that asks for a retry a minute
    on: Celery's eager call retries at once (it ignores a countdown), and so does the
    journal's now. It slept the minute out: a team's eager test of a failing task waited
    out every backoff (about 30 s for the default five attempts)."""
    bare = celery.Celery("bare", broker="memory://")
    seen: list[int] = []

    @bare.task(bind=True)
    def retries_in_a_minute(self: Any) -> int:
        seen.append(1)
        if len(seen) == 1:
            raise self.retry(countdown=60)
        return int(self.request.retries)

    started = time.monotonic()
    ours = tasks.retries_in_a_minute.apply((uuid.uuid4().hex,))
    took = time.monotonic() - started
    theirs = retries_in_a_minute.apply()

    assert (ours.get(), ours.state) == (theirs.get(), theirs.state) == (1, "SUCCESS")
    assert took < 30, f"apply() took {took:.0f}s"
    row = run_row(db, uuid.UUID(ours.id))
    assert (row["state"], row["attempts"]) == ("succeeded", 2)


def test_printing_a_handle_is_one_line(db: Engine) -> None:
    queued = tasks.echo.apply_async(("printed",), countdown=3600)

    assert repr(queued) == f"<JobHandle tests.echo {queued.job_id} enqueued>"
    looked_up = tasks.echo.AsyncResult(queued.id)
    assert repr(looked_up) == f"<JobHandle tests.echo {queued.id} duplicate>"
    assert str(queued) == queued.id  # Celery's str() of a result


def test_a_task_id_of_the_callers_own_is_its_job_and_stays_its_id(
    worker: object, db: Engine
) -> None:
    mine, later = (f"order-{uuid.uuid4().hex[:8]}:{what}" for what in ("receipt", "later"))

    sent = tasks.echo.apply_async(args=(mine,), task_id=mine)
    # Due in an hour: still queued when the same id comes again.
    first, again = (
        tasks.echo.apply_async(args=(later,), task_id=later, countdown=3600) for _ in range(2)
    )

    assert sent.id == mine
    assert sent.get(timeout=30) is None
    looked_up = tasks.echo.AsyncResult(mine)
    assert (looked_up.id, looked_up.job_id) == (mine, sent.job_id)
    assert looked_up.successful()
    assert tasks.calls(mine) == 1
    assert (again.id, again.job_id, again.outcome) == (later, first.job_id, "duplicate")


def test_a_call_that_does_not_fit_a_typing_false_task_fails_in_the_worker_once(
    worker: object, db: Engine
) -> None:
    # Celery's typing=False: the call is sent as given and the worker's call of the body
    # raises, as in Celery; a mistake in the call, so the run is not retried.
    sent = habit_tasks.untyped.delay("a", "b")
    with pytest.raises(TypeError, match=r"untyped\(\) takes 1 positional argument but 2 were"):
        sent.get(timeout=30)
    row = run_row(db, sent.job_id)
    assert (row["state"], row["attempts"], row["outcome"]) == ("failed", 1, "permanent")
    # A key is made of the arguments by name: such a call is refused where it is made.
    with pytest.raises(TypeError, match=r"takes 1 positional argument but 2 were given"):
        habit_tasks.untyped_keyed.delay("a", "b")
    # Celery's default checks the call: refused, nothing written.
    with pytest.raises(TypeError, match=r"takes 1 positional argument but 2 were given"):
        tasks.echo.delay("a", "b")
    assert _count(db, JobRun.__table__) == 1


def test_a_job_id_that_is_not_a_uuid_is_refused_with_what_to_pass(db: Engine) -> None:
    with pytest.raises(
        ValueError,
        match=r"^tests.echo.apply_async: job_id must be a UUID, "
        r"not 'mine'; pass task_id='mine'",
    ):
        tasks.echo.apply_async(args=("t",), job_id="mine")


def test_a_non_json_argument_is_refused_by_name_and_nothing_is_written(db: Engine) -> None:
    # Celery's JSON serializer (kombu) raises EncodeError for these at the call too.
    with pytest.raises(
        TypeError,
        match=r"argument 'token' of tests.echo is a set, "
        r"not JSON: pass a list",
    ):
        tasks.echo.delay({"a", "b"})
    with pytest.raises(TypeError, match=r"argument 'secret' of tests.flaky is a object"):
        tasks.flaky.apply_async(kwargs={"token": "t", "fail_times": 0, "secret": [object()]})
    assert _count(db, JobRun.__table__) == 0
    assert _count(db, OUTBOX) == 0


def test_a_calls_own_headers_are_kept_beside_its_arguments_the_trace_apart(db: Engine) -> None:
    # The body reads them as self.request.tenant (the conformance suite, real workers).
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    handle = tasks.echo.apply_async(("t",), headers={"tenant": "acme", "traceparent": trace})
    row = run_row(db, handle.job_id)
    assert row["params"] == {"args": ["t"], "kwargs": {}, "headers": {"tenant": "acme"}}
    plain = tasks.echo.apply_async(("u",), headers={"traceparent": trace})
    assert run_row(db, plain.job_id)["params"] == {"args": ["u"], "kwargs": {}}


def test_a_header_celerys_request_holds_or_json_cannot_carry_is_refused(db: Engine) -> None:
    with pytest.raises(TypeError, match=r"headers \['retries'\] are fields of Celery's request"):
        tasks.echo.apply_async(("t",), headers={"retries": 3})
    with pytest.raises(TypeError, match=r"headers \['jobsapp_x'\] are fields"):
        tasks.echo.apply_async(("t",), headers={"jobsapp_x": 1})
    with pytest.raises(TypeError, match=r"argument 'header tenant' of tests.echo is a set"):
        tasks.echo.apply_async(("t",), headers={"tenant": {"a"}})
    ids = {"attachment_id": uuid.uuid4(), "pipeline_version": 1}
    with pytest.raises(TypeError, match=r"headers= needs a run table that keeps the call"):
        process_attachment.apply_async(kwargs=ids, headers={"tenant": "acme"})
    assert _count(db, JobRun.__table__) == 0
    assert _count(db, OUTBOX) == 0


def test_a_kombu_queue_is_kept_by_its_name_unless_it_routes_otherwise(db: Engine) -> None:
    handle = tasks.echo.apply_async(("q",), queue=Queue("habits-b"))
    assert run_row(db, handle.job_id)["queue"] == "habits-b"
    topic = Queue("habits-t", Exchange("events", type="topic"), routing_key="habits.#")
    with pytest.raises(TypeError, match=r"routes by exchange 'events' and routing key"):
        tasks.echo.apply_async(("t",), queue=topic)
    assert _count(db, JobRun.__table__) == 1


def test_an_unsupported_celery_option_is_refused_with_what_to_do_instead(db: Engine) -> None:
    with pytest.raises(TypeError, match=r"does not support \['exchange'\].*pass queue="):
        tasks.echo.apply_async(args=("x",), exchange="elsewhere")
    with pytest.raises(TypeError, match=r"\['serializer'\].*only serializer='json'"):
        tasks.echo.apply_async(args=("x",), serializer="pickle")
    assert _count(db, JobRun.__table__) == 0
    # What changes nothing a job keeps is taken, as Celery takes it.
    tasks.echo.apply_async(args=("y",), serializer="json", ignore_result=True, compression="zlib")
    assert _count(db, JobRun.__table__) == 1


def test_a_connection_that_is_neither_a_transaction_nor_a_broker_is_refused(db: Engine) -> None:
    # connection= is Celery's broker connection or a SQLAlchemy Connection to join.
    with pytest.raises(TypeError, match=r"connection= takes a SQLAlchemy Connection .* not str"):
        tasks.echo.apply_async(args=("x",), connection="postgresql://elsewhere")
    assert _count(db, JobRun.__table__) == 0


def test_the_relay_reports_a_message_nobody_claims_and_a_task_nobody_registered(
    pg: Engine, redis_clean: None, caplog: pytest.LogCaptureFixture
) -> None:
    job = tasks.echo.new_job((), {"token": "orphan"}, None)
    job = replace(job, task_name="tests.nobody_registered")
    with pg.begin() as conn:
        journal.enqueue(conn, job, actor="producer")
    cfg = relay.RelayConfig(grace=timedelta(0), unclaimed_after=timedelta(seconds=UNCLAIMED_AFTER))
    before = _relay_counts(pg)
    assert relay.run_once(app, pg, cfg)["published"] == 1
    with caplog.at_level(logging.WARNING, logger=relay.__name__):
        # No worker runs here: past its unclaimed time the message still waits in its
        # queue, and is not copied.
        time.sleep(UNCLAIMED_AFTER * 2)
        assert relay.run_once(app, pg, cfg)["republished"] == 0
    assert "tests.nobody_registered is registered nowhere" in caplog.text
    assert "JOBSAPP_IMPORTS" in caplog.text
    assert _relay_counts(pg) == before

    # A worker that does not know the task drops it: the queue no longer holds it.
    redis.Redis.from_url(service("JOBSAPP_TEST_REDIS_URL")).delete(app.conf.task_default_queue)
    eventually(lambda: relay.run_once(app, pg, cfg)["republished"] == 1)
    after = _relay_counts(pg)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
