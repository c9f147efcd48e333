"""Canvas workflows kept in the journal: what Celery's canvas loses, checked where it would.

The successor of a step is written in the transaction of the step's success (a rolled
back success leaves neither); a chord's body is written once when two members finish at
the same moment; a retried step redoes only itself; a failed step replayed by the operator
resumes the chain (celery#5970); a chord whose member fails blocks its body visibly and
calls the body's errback, as does one revoked, cancelled or expired, queued or running;
``queue`` and ``priority`` given on a step are kept for it.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group
from celery.exceptions import ChordError, TaskRevokedError
from celery.result import AsyncResult
from sqlalchemy import Engine, event, inspect, select, update

from jobsapp import cli, operator
from jobsapp.db import make_engine, utcnow
from jobsapp.lifecycle import journal
from jobsapp.lifecycle.celery_api.group_handles import GroupHandle, StepHandle
from jobsapp.lifecycle.journal import workflow
from jobsapp.lifecycle.journal.registry import JOBS
from jobsapp.lifecycle.journal.workflow import STEPS
from jobsapp.lifecycle.rules.states import Transition
from jobsapp.lifecycle.workflows.canvas import MixedCanvas
from jobsapp.maintenance import relay
from jobsapp.web.app import create_app
from tests.support import canvas_tasks as t
from tests.support.attachments import environment
from tests.support.env import SESSION, service
from tests.support.journal_view import outbox_rows, run_row, transitions
from tests.support.migrations import each_dialect_down_and_up, sqlite_then_postgres
from tests.support.tasks import calls
from tests.support.waiting import eventually, waiting_for_a_lock
from tests.support.web import log_in
from tests.support.workers import in_process_worker

pytestmark = pytest.mark.timeout(120)

WAIT = 20
ADMIN_TOKEN = "workflow-admin-token-7f3a9c2e5b1d8064"
ADMIN_BASE = "http://admin.local"


def _token(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def _steps(engine: Engine, workflow_id: uuid.UUID) -> dict[str, Mapping[str, Any]]:
    """The workflow's steps by their place in the canvas."""
    with engine.connect() as conn:
        rows = conn.execute(select(STEPS).where(STEPS.c.workflow_id == workflow_id)).mappings()
        return {row["path"]: row for row in rows}


def _run(engine: Engine, job_id: uuid.UUID) -> Mapping[str, Any] | None:
    with engine.connect() as conn:
        run = journal.load(conn, JOBS, job_id)
    return None if run is None else run.columns


def _claim(engine: Engine, job_id: uuid.UUID) -> uuid.UUID:
    """Claim the step's first attempt as a worker would; returns the claim's token."""
    with engine.begin() as conn:
        row = journal.claim(conn, JOBS, job_id, 1, worker="test-worker")
    assert row is not None
    return row.claimed_token


def _succeed(conn: Any, job_id: uuid.UUID, token: uuid.UUID, result: Any) -> bool:
    return journal.succeed(conn, JOBS, job_id, 1, token=token, actor="test-worker", result=result)


def _succeed_then_die(
    engine: Engine, job_id: uuid.UUID, token: uuid.UUID, successor: uuid.UUID
) -> None:
    with engine.begin() as conn:
        assert _succeed(conn, job_id, token, 3)
        assert journal.load(conn, JOBS, successor) is not None  # written, not committed
        raise RuntimeError("the worker died before COMMIT")


def test_a_successor_is_written_in_the_transaction_of_its_parents_success(
    pg: Engine, redis_clean: None
) -> None:
    handle = chain(t.add.s(1, 2), t.add.s(3)).apply_async()
    assert isinstance(handle, StepHandle)
    first = _steps(pg, handle.workflow_id)["0.0"]["job_id"]
    token = _claim(pg, first)
    with pytest.raises(RuntimeError, match="died before COMMIT"):
        _succeed_then_die(pg, first, token, handle.job_id)
    # Rolled back together: the parent still running, no successor, no message for it.
    assert run_row(pg, first)["state"] == "running"
    assert _run(pg, handle.job_id) is None
    assert outbox_rows(pg, handle.job_id) == []
    with pg.begin() as conn:
        assert _succeed(conn, first, token, 3)
    successor = run_row(pg, handle.job_id)
    assert (successor["state"], successor["params"]["args"]) == ("queued", [3, 3])
    assert [row["attempt"] for row in outbox_rows(pg, handle.job_id)] == [1]


def _finish(engine: Engine, job_id: uuid.UUID, result: Any) -> None:
    token = _claim(engine, job_id)
    with engine.begin() as conn:
        assert _succeed(conn, job_id, token, result)


def test_what_a_chords_body_starts_roots_where_the_body_did(pg: Engine, redis_clean: None) -> None:
    # Celery sends a chord's body from its last member, and the body's next step from the
    # body: both root at that member (the members, sent from outside a task, are each
    # their own root), whichever member it is. A chain as a chord's body: its last task
    # carries the group's id.
    handle = chord([t.add.s(1, 1), t.add.s(2, 2)], chain(t.tsum.s(), t.add.s(1))).apply_async()
    steps = _steps(pg, handle.workflow_id)
    first, last, body = (steps[p]["job_id"] for p in ("0.h.0", "0.h.1", "0.body.0"))
    _finish(pg, last, 4)
    _finish(pg, first, 2)
    lineage = _run(pg, body)["params"]["lineage"]  # type: ignore[index]
    assert lineage == {"root_id": str(first), "parent_id": str(first), "group": None}
    _finish(pg, body, 6)
    lineage = _run(pg, handle.job_id)["params"]["lineage"]  # type: ignore[index]
    group_id = str(handle.workflow_id)
    assert lineage == {"root_id": str(first), "parent_id": str(body), "group": group_id}


def test_a_step_that_ends_its_chain_cancels_the_rest_and_keeps_its_links(
    pg: Engine, redis_clean: None
) -> None:
    # Celery's idiom: a body sets self.request.chain = None; its link callbacks still run.
    first = t.add.s(1, 2)
    first.link(t.identity.s())
    handle = chain(first, t.add.s(3), t.add.s(4)).apply_async()
    steps = _steps(pg, handle.workflow_id)
    job_id = steps["0.0"]["job_id"]
    token = _claim(pg, job_id)
    with pg.begin() as conn:
        assert journal.succeed(
            conn, JOBS, job_id, 1, token=token, actor="test-worker", result=3, chain_ended=True
        )
    steps = _steps(pg, handle.workflow_id)
    assert [steps[p]["blocked_outcome"] for p in ("0.1", "0.2")] == ["cancelled", "cancelled"]
    assert _run(pg, steps["0.1"]["job_id"]) is None
    link = _run(pg, steps["0.0.link0"]["job_id"])
    assert (link or {}).get("state") == "queued"
    assert handle.state == "REVOKED"
    # What its success sent, as Celery's result says it: the link, not the rest.
    sent = AsyncResult(str(job_id), app=handle.app).children
    assert [kid.id for kid in sent] == [str(steps["0.0.link0"]["job_id"])]


def test_a_successor_whose_worker_died_before_publishing_is_published_by_the_relay(
    pg: Engine, redis_clean: None
) -> None:
    handle = chain(t.add.s(1, 2), t.add.s(3)).apply_async()
    first = _steps(pg, handle.workflow_id)["0.0"]["job_id"]
    token = _claim(pg, first)
    with pg.begin() as conn:  # committed; the worker that would publish is gone
        assert _succeed(conn, first, token, 3)
    assert outbox_rows(pg, handle.job_id)[0]["published_at"] is None
    with in_process_worker():
        assert relay.run_once(t.add.app, pg, relay.RelayConfig(grace=timedelta(0)))["published"]
        assert handle.get(timeout=WAIT) == 6


def test_a_chords_body_is_written_once_when_two_members_finish_at_once(
    pg: Engine, redis_clean: None
) -> None:
    handle = chord([t.add.s(1, 1), t.add.s(2, 2)], t.tsum.s()).apply_async()
    steps = _steps(pg, handle.workflow_id)
    members = [steps["0.h.0"]["job_id"], steps["0.h.1"]["job_id"]]
    tokens = [_claim(pg, member) for member in members]
    first_written, release = threading.Event(), threading.Event()
    outcomes: list[bool] = []

    def finish(index: int, result: int) -> None:
        with pg.begin() as conn:
            outcomes.append(_succeed(conn, members[index], tokens[index], result))
            if index == 0:  # holds its transaction open while the second member finishes
                first_written.set()
                release.wait(WAIT)

    # The second member's finish waits on the body's step row until the first commits
    # (or, without that lock, has already decided without seeing the first's success).
    _meet_at_a_lock(
        pg,
        threading.Thread(target=finish, args=(0, 2)),
        threading.Thread(target=finish, args=(1, 4)),
        first_written,
        release,
    )
    assert outcomes == [True, True]
    body = run_row(pg, handle.job_id)
    assert (body["state"], body["params"]["args"]) == ("queued", [[2, 4]])
    assert transitions(pg, handle.job_id) == [Transition.ENQUEUE.value]
    assert len(outbox_rows(pg, handle.job_id)) == 1


def _meet_at_a_lock(
    engine: Engine,
    first: threading.Thread,
    second: threading.Thread,
    held: threading.Event,
    release: threading.Event,
) -> None:
    """``first`` holds its transaction open (``held``, until ``release``) while ``second``
    runs into it, until ``second`` waits on a lock (or is done); then both end."""
    first.start()
    assert held.wait(WAIT)
    second.start()
    eventually(lambda: waiting_for_a_lock(engine) or not second.is_alive())
    release.set()
    for thread in (first, second):
        thread.join(WAIT)


def _rows_fetched(engine: Engine) -> list[int]:
    """The rows each SELECT run on ``engine`` returns, appended as they run."""
    fetched: list[int] = []

    @event.listens_for(engine, "after_cursor_execute")
    def count(_conn: Any, cursor: Any, statement: str, *_rest: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            fetched.append(cursor.rowcount)

    return fetched


def test_the_successes_of_a_chords_100_members_read_each_result_once(
    pg: Engine, postgres_url: str, redis_clean: None
) -> None:
    members = 100
    handle = chord([t.add.s(i, i) for i in range(members)], t.tsum.s()).apply_async()
    steps = _steps(pg, handle.workflow_id)
    ids = [steps[f"0.h.{i}"]["job_id"] for i in range(members)]
    worker = make_engine(postgres_url)
    fetched = _rows_fetched(worker)
    for i, member in enumerate(ids):
        token = _claim(pg, member)
        with worker.begin() as conn:
            assert _succeed(conn, member, token, 2 * i)
    worker.dispose()
    body = run_row(pg, handle.job_id)
    assert (body["state"], body["params"]["args"]) == ("queued", [[2 * i for i in range(members)]])
    # A few rows per success and the members' once at the last: before the count, every
    # success read every member's step and run rows (about 10,000 rows for 100).
    assert sum(fetched) <= 5 * members, (sum(fetched), len(fetched))


def _member_successes(pg: Engine, postgres_url: str, members: int) -> list[tuple[int, int]]:
    """The (statements, rows returned) of each member's success of a chord of ``members``,
    in the order they succeed."""
    handle = chord([t.add.s(i, i) for i in range(members)], t.tsum.s()).apply_async()
    steps = _steps(pg, handle.workflow_id)
    worker = make_engine(postgres_url)
    ran: list[int] = []

    @event.listens_for(worker, "after_cursor_execute")
    def count(_conn: Any, cursor: Any, *_rest: Any) -> None:
        ran.append(max(cursor.rowcount, 0))

    each = []
    for i in range(members):
        member = steps[f"0.h.{i}"]["job_id"]
        token = _claim(pg, member)
        ran.clear()
        with worker.begin() as conn:
            assert _succeed(conn, member, token, i)
        each.append((len(ran), sum(ran)))
    worker.dispose()
    assert run_row(pg, handle.job_id)["params"]["args"] == [list(range(members))]
    return each


def test_a_chord_members_success_costs_the_same_however_many_members_it_has(
    pg: Engine, postgres_url: str, redis_clean: None
) -> None:
    small, large = _member_successes(pg, postgres_url, 10), _member_successes(pg, postgres_url, 40)
    # Every member but the last: the same statements and rows, at 10 members as at 40.
    assert len(set(small[:-1]) | set(large[:-1])) == 1, (small, large)
    # The last reads every member's step and run row, once: 30 members more, 60 rows more.
    (_, last_small), (_, last_large) = small[-1], large[-1]
    assert last_large - last_small == 2 * 30, (small[-1], large[-1])


def test_a_retried_step_redoes_only_itself(pg: Engine, redis_clean: None) -> None:
    first, flaky, last = _token("first"), _token("flaky"), _token("last")
    with in_process_worker():
        handle = chain(
            t.counted.s(1, first), t.flaky_add.s(flaky, 2), t.counted.s(last)
        ).apply_async()
        assert handle.get(timeout=WAIT) == 2
    assert (calls(first), calls(flaky), calls(last)) == (1, 3, 1)
    retried = _steps(pg, handle.workflow_id)["0.1"]["job_id"]
    assert run_row(pg, retried)["attempts"] == 3
    assert repr(handle) == f"<JobHandle tests.canvas.counted {handle.job_id} enqueued>"


def test_a_failed_step_replayed_by_the_operator_resumes_the_chain(
    pg: Engine, redis_clean: None
) -> None:
    first, once, last = _token("first"), _token("once"), _token("last")
    with in_process_worker():
        handle = chain(
            t.counted.s(1, first), t.flaky_once.s(once, 1), t.counted.s(last)
        ).apply_async()
        # As Celery's chain: the failed step's own exception.
        with pytest.raises(ConnectionError, match="upstream down"):
            handle.get(timeout=WAIT)
        assert handle.state == "FAILURE"
        failed = _steps(pg, handle.workflow_id)["0.1"]["job_id"]
        assert run_row(pg, failed)["state"] == "failed"
        operator.replay(pg, "jobs", failed, actor="ops", reason="upstream is back", app=t.add.app)
        eventually(lambda: _run(pg, handle.job_id) is not None)
        assert handle.get(timeout=WAIT) == 2
    assert (calls(first), calls(once), calls(last)) == (1, 2, 1)
    assert _steps(pg, handle.workflow_id)["0.2"]["blocked_at"] is None


def test_a_chord_whose_member_fails_blocks_its_body_and_calls_its_errback(
    pg: Engine, redis_clean: None
) -> None:
    errback, token = str(uuid.uuid4()), _token("member")
    body = t.tsum.s().on_error(t.identity.s().set(task_id=errback))
    with in_process_worker():
        handle = chord([t.add.s(1, 1), t.fail.s(token)], body).apply_async()
        assert t.identity.AsyncResult(errback).get(timeout=WAIT) == str(handle.job_id)
        # As Celery's chord: the member's error, or the body's ChordError naming it.
        with pytest.raises((ValueError, ChordError), match="expected failure of"):
            handle.get(timeout=WAIT)
    assert _run(pg, handle.job_id) is None  # the body never ran
    # Looked up later by its id, as a Celery user would: failed, not pending forever.
    assert t.tsum.AsyncResult(str(handle.job_id)).state == "FAILURE"
    steps = _steps(pg, handle.workflow_id)
    assert steps["0.body"]["blocked_outcome"] == "chord_failed"
    assert run_row(pg, steps["0.h.0"]["job_id"])["state"] == "succeeded"


def test_a_step_the_reaper_fails_blocks_what_waits_for_it_and_starts_its_errback(
    pg: Engine, redis_clean: None
) -> None:
    errback = str(uuid.uuid4())
    first_step = t.add.s(1, 1).on_error(t.identity.s().set(task_id=errback))
    handle = chain(first_step, t.add.s(2)).apply_async()
    first = _steps(pg, handle.workflow_id)["0.0"]["job_id"]
    _claim(pg, first)
    now = utcnow() + timedelta(seconds=1)  # its heartbeat is older than this cutoff
    with pg.begin() as conn:
        stale = journal.find_stale(conn, JOBS, cutoff=now, limit=10)
        journal.reap(
            conn,
            JOBS,
            stale,
            requeue_them=False,
            cutoff=now,
            reason="stale: its worker was lost",
            now=now,
        )
    assert run_row(pg, first)["outcome"] == "stale"
    assert (handle.state, handle.row()["outcome"]) == ("FAILURE", "upstream_failed")
    called = run_row(pg, uuid.UUID(errback))
    assert (called["state"], called["params"]["args"]) == ("queued", [str(first)])


def _revoked_while_running(engine: Engine, job_id: uuid.UUID, *, ended_by: str) -> None:
    """A revoke of the running step ``job_id``, then its end: by its worker at its next
    beat (honour_cancel), or by the reaper once its worker died (a stale heartbeat)."""
    token = _claim(engine, job_id)
    with engine.begin() as conn:
        asked = journal.revoke(conn, JOBS, job_id, actor="test", reason="revoked")
        assert asked is journal.Revoked.REQUESTED
    with engine.begin() as conn:
        if ended_by == "its worker":
            assert journal.honour_cancel(conn, JOBS, job_id, 1, token=token, actor="test-worker")
        else:
            now = utcnow() + timedelta(seconds=1)  # its heartbeat is older than this cutoff
            stale = journal.find_stale(conn, JOBS, cutoff=now, limit=10)
            reaped = journal.reap(
                conn, JOBS, stale, requeue_them=False, cutoff=now, reason="stale", now=now
            )
            assert [run.job_id for run in reaped] == [job_id]
    assert run_row(engine, job_id)["outcome"] == "cancelled"


@pytest.mark.parametrize("ended_by", ["its worker", "the reaper"])
def test_a_step_revoked_while_running_blocks_what_waits_for_it_and_starts_no_errback_of_its_own(
    pg: Engine, redis_clean: None, ended_by: str
) -> None:
    # Celery's answer to a revoked task: no errback of its own (mark_as_revoked calls
    # none), and a chord it is a member of fails, calling the body's errbacks. Before, its
    # worker's end left what waited for it waiting for good, and the reaper's started its
    # errbacks as for a failure.
    _an_end_blocks_what_waits_and_starts_no_errback_of_its_own(
        pg, partial(_revoked_while_running, ended_by=ended_by), "cancelled"
    )


def _revoked_while_queued(engine: Engine, job_id: uuid.UUID) -> None:
    with engine.begin() as conn:
        done = journal.revoke(conn, JOBS, job_id, actor="test", reason="revoked")
    assert done is journal.Revoked.CANCELLED


def _cancelled_by_an_operator(engine: Engine, job_id: uuid.UUID) -> None:
    done = operator.cancel(engine, JOBS.module, job_id, actor="ops", reason="not wanted")
    assert not done.running


def _expired_while_queued(engine: Engine, job_id: uuid.UUID) -> None:
    """The reaper's expiry of the queued step (a worker's claim of its message expires it
    with journal.expire, the same write)."""
    now = utcnow()
    table = JOBS.table
    with engine.begin() as conn:
        conn.execute(update(table).where(table.c.job_id == job_id).values(expires_at=now))
        assert journal.expire_due(conn, JOBS, limit=10, actor="reaper", now=now) == 1


@pytest.mark.parametrize(
    ("end", "outcome"),
    [
        (_revoked_while_queued, "cancelled"),
        (_cancelled_by_an_operator, "cancelled"),
        (_expired_while_queued, "expired"),
    ],
    ids=["a revoke", "an operator's cancel", "an expiry"],
)
def test_a_step_ended_while_queued_blocks_what_waits_for_it_and_starts_no_errback_of_its_own(
    pg: Engine, redis_clean: None, end: Callable[[Engine, uuid.UUID], None], outcome: str
) -> None:
    # Celery's worker drops a revoked or expired message and marks it revoked: a chord it
    # is a member of fails, calling the body's errbacks; its own errbacks never run. Before,
    # a step ended while queued blocked nothing: the chord's body waited for good.
    _an_end_blocks_what_waits_and_starts_no_errback_of_its_own(pg, end, outcome)


def test_a_step_revoked_before_its_run_is_written_never_runs_on_a_worker_started_later(
    pg: Engine, redis_clean: None
) -> None:
    # A chain's later step and a chord's body have no run until what they wait for
    # succeeds; their revoke was Celery's broadcast alone, which a worker started later
    # never hears (celery#4300): the step ran. Now it is kept in the journal.
    first, middle, last, member = _token("first"), _token("middle"), _token("last"), _token("m")
    handle = chain(t.counted.s(1, first), t.counted.s(middle), t.counted.s(last)).apply_async()
    joined = chord([t.counted.s(1, member)], t.tsum.s()).apply_async()
    revoked = [handle.parent.id, joined.id]
    t.add.app.control.revoke(revoked)  # no worker up: the broadcast reaches none
    with in_process_worker():
        with pytest.raises(TaskRevokedError):  # as Celery's chain.get(): the revoked step's
            handle.get(timeout=WAIT)
        ran = [handle.parent.parent.id, joined.parent.results[0].id]
        eventually(lambda: [_state(pg, each) for each in ran] == ["succeeded"] * 2)
    assert [_run(pg, uuid.UUID(each)) for each in revoked] == [None, None]
    assert (calls(first), calls(member), calls(middle), calls(last)) == (1, 1, 0, 0)
    assert [AsyncResult(each, app=t.add.app).state for each in revoked] == ["REVOKED"] * 2
    assert (handle.state, handle.row()["outcome"]) == ("FAILURE", "upstream_failed")


@pytest.mark.parametrize("first", ["the success", "the revoke"])
def test_a_steps_revoke_and_the_success_that_starts_it_at_once_leave_it_unrun(
    pg: Engine, redis_clean: None, first: str
) -> None:
    # Each takes the step's row lock; the one that waits sees what the other committed: a
    # run written first is revoked as a run, a step blocked first is never started.
    handle = chain(t.add.s(1, 2), t.add.s(3)).apply_async()
    before = _steps(pg, handle.workflow_id)["0.0"]["job_id"]
    token = _claim(pg, before)
    held, release = threading.Event(), threading.Event()

    def succeed() -> None:
        with pg.begin() as conn:
            assert _succeed(conn, before, token, 3)
            if first == "the success":
                held.set()
                release.wait(WAIT)

    def revoke() -> None:
        if first == "the success":
            t.add.app.control.revoke(handle.id)
            return
        with pg.begin() as conn:
            found = workflow.revoke_unstarted(
                conn, handle.job_id, "revoked", actor="test", started=[]
            )
            assert found is workflow.StepRevoke.BLOCKED
            held.set()
            release.wait(WAIT)

    threads = [threading.Thread(target=succeed), threading.Thread(target=revoke)]
    if first == "the revoke":
        threads.reverse()
    _meet_at_a_lock(pg, *threads, held, release)
    assert run_row(pg, before)["state"] == "succeeded"
    run = _run(pg, handle.job_id)
    assert run is None or (run["state"], run["outcome"]) == ("failed", "cancelled")
    assert (run is None) == (first == "the revoke")
    assert handle.state == "REVOKED"


def _state(engine: Engine, job_id: str) -> str | None:
    run = _run(engine, uuid.UUID(job_id))
    return None if run is None else str(run["state"])


def _an_end_blocks_what_waits_and_starts_no_errback_of_its_own(
    pg: Engine, end: Callable[[Engine, uuid.UUID], None], outcome: str
) -> None:
    """``end`` of a chain's first step and of a chord's member: the rest of the chain
    upstream_failed, the chord's body chord_failed with its errback started, and no
    errback of the ended step's own."""
    own, bodys = str(uuid.uuid4()), str(uuid.uuid4())
    first = t.add.s(1, 1).on_error(t.identity.s().set(task_id=own))
    handle = chain(first, t.add.s(2)).apply_async()
    ended = _steps(pg, handle.workflow_id)["0.0"]["job_id"]
    end(pg, ended)
    assert run_row(pg, ended)["outcome"] == outcome
    assert _run(pg, uuid.UUID(own)) is None
    assert (handle.state, handle.row()["outcome"]) == ("FAILURE", "upstream_failed")
    with pytest.raises(TaskRevokedError):  # as Celery's chain.get(): the ended step's
        handle.get(timeout=WAIT)

    body = t.tsum.s().on_error(t.identity.s().set(task_id=bodys))
    joined = chord([t.add.s(1, 1), t.add.s(2, 2)], body).apply_async()
    member = _steps(pg, joined.workflow_id)["0.h.0"]["job_id"]
    end(pg, member)
    assert (joined.state, joined.row()["outcome"]) == ("FAILURE", "chord_failed")
    called = run_row(pg, uuid.UUID(bodys))
    assert (called["state"], called["params"]["args"]) == ("queued", [str(joined.job_id)])
    with pytest.raises(ChordError, match=f"Dependency {member} raised TaskRevokedError"):
        joined.get(timeout=WAIT, follow_parents=False)


def _published_priority(queue: str) -> int | None:
    """The priority of the one message waiting in ``queue`` (kombu's Redis lists)."""
    client = redis.Redis.from_url(service("JOBSAPP_TEST_REDIS_URL"))
    for key in client.scan_iter(f"{queue}*"):
        for raw in client.lrange(key, 0, -1):
            return int(json.loads(raw)["properties"]["priority"])
    return None


def test_queue_and_priority_given_on_a_step_are_kept_for_it(pg: Engine, redis_clean: None) -> None:
    elsewhere = f"jobsapp-tests-{SESSION}-canvas-{uuid.uuid4().hex[:6]}"
    with in_process_worker():
        handle = chain(t.add.s(1, 1), t.add.s(2).set(queue=elsewhere, priority=7)).apply_async()
        eventually(lambda: _run(pg, handle.job_id) is not None)
    step = _steps(pg, handle.workflow_id)["0.1"]
    assert (step["queue"], step["priority"]) == (elsewhere, 7)
    assert run_row(pg, handle.job_id)["queue"] == elsewhere
    assert [row["queue"] for row in outbox_rows(pg, handle.job_id)] == [elsewhere]
    assert eventually(lambda: _published_priority(elsewhere)) == 7


def test_a_canvas_mixing_a_plain_celery_task_is_refused_naming_it(pg: Engine) -> None:
    plain = Celery("plain-canvas")
    plain_add = plain.task(name="plain.add")(t.BODIES["add"])
    with pytest.raises(MixedCanvas, match=r"^plain\.add is a plain Celery task"):
        chain(t.add.s(1, 1), plain_add.s(2)).apply_async()
    with pg.connect() as conn:
        assert conn.execute(select(STEPS.c.job_id)).first() is None


def test_a_steps_countdown_that_is_not_seconds_up_to_a_year_is_refused_writing_nothing(
    pg: Engine,
) -> None:
    # An infinite one was kept, and every start of the step failed in its predecessor's
    # success (timedelta overflows).
    for bad in (float("inf"), 400 * 24 * 3600, "soon"):
        with pytest.raises(ValueError, match=r"^countdown must be between 0 and 31536000"):
            chain(t.add.s(1, 1), t.add.s(2).set(countdown=bad)).apply_async()
    with pg.connect() as conn:
        assert conn.execute(select(STEPS.c.job_id)).first() is None
        assert conn.execute(select(JOBS.table.c.job_id)).first() is None


def test_a_canvas_sent_twice_with_one_task_id_is_one_workflow(
    pg: Engine, redis_clean: None
) -> None:
    canvas = chord([t.add.s(i, i) for i in range(3)], t.tsum.s())
    once = canvas.apply_async(task_id="nightly-2026-12-01")
    again = canvas.apply_async(task_id="nightly-2026-12-01")
    assert (again.job_id, again.workflow_id) == (once.job_id, once.workflow_id)
    with pg.connect() as conn:
        runs = conn.execute(select(JOBS.table.c.job_id)).all()
    assert len(_steps(pg, once.workflow_id)) == 4
    assert len(runs) == 3  # the members; the body waits for them


def test_a_groups_handle_answers_in_order(pg: Engine, redis_clean: None) -> None:
    with in_process_worker():
        handle = group(t.add.s(i, 10) for i in range(3)).apply_async()
        assert isinstance(handle, GroupHandle)
        assert handle.get(timeout=WAIT) == [10, 11, 12]
        assert (len(handle), handle.ready(), handle.successful()) == (3, True, True)


def test_an_operator_sees_a_workflows_steps_on_the_job_page_and_in_the_summary(
    pg: Engine, redis_clean: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with in_process_worker():
        handle = chain(
            t.counted.s(1, _token("first")),
            t.flaky_once.s(_token("once"), 1),
            t.counted.s(_token("last")),
        ).apply_async()
        with pytest.raises(ConnectionError):
            handle.get(timeout=WAIT)
    failed = _steps(pg, handle.workflow_id)["0.1"]["job_id"]
    with environment(JOBSAPP_ADMIN_TOKEN=ADMIN_TOKEN):
        client = create_app().test_client()
        log_in(client, ADMIN_BASE, ADMIN_TOKEN)
        page = client.get(f"/admin/jobs/jobs/{failed}", base_url=ADMIN_BASE).get_data(True)
    shown = re.findall(r'<td class="(\w+)">\w+</td><td>(\w*)</td></tr>', page)
    assert shown == [
        ("succeeded", "succeeded"),
        ("failed", "exhausted"),
        ("blocked", "upstream_failed"),
    ]
    assert f'href="/admin/jobs/jobs/{failed}"' in page  # each step with a run links to it

    assert cli.main(["summary", "--workflow", str(handle.workflow_id)]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [(line[0], line[3]) for line in lines[1:]] == [
        ("0.0", "succeeded"),
        ("0.1", "failed"),
        ("0.2", "blocked"),
    ]


def test_an_operator_cancels_the_rest_of_a_workflow_from_a_steps_page(
    pg: Engine, redis_clean: None
) -> None:
    handle = chain(t.add.s(1, 1), t.add.s(2), t.add.s(3)).apply_async()  # no worker runs
    first = _steps(pg, handle.workflow_id)["0.0"]["job_id"]
    with environment(JOBSAPP_ADMIN_TOKEN=ADMIN_TOKEN):
        client = create_app().test_client()
        log_in(client, ADMIN_BASE, ADMIN_TOKEN)
        page = client.get(f"/admin/jobs/jobs/{first}", base_url=ADMIN_BASE).get_data(True)
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert csrf is not None
        assert 'id="cancel-workflow"' in page
        client.post(
            f"/admin/jobs/jobs/{first}/cancel-workflow",
            base_url=ADMIN_BASE,
            data={"csrf_token": csrf[1], "reason": "wrong input"},
        )
        shown = client.get(f"/admin/jobs/jobs/{first}", base_url=ADMIN_BASE).get_data(True)
    assert "Workflow cancelled: no step starts from now on; 1 queued cancelled." in shown
    assert run_row(pg, first)["outcome"] == "cancelled"
    assert [s["blocked_outcome"] for s in _steps(pg, handle.workflow_id).values()] == [
        "cancelled"
    ] * 3
    assert handle.state == "REVOKED"


def test_a_step_running_when_its_workflow_is_cancelled_finishes_and_starts_nothing(
    pg: Engine, redis_clean: None
) -> None:
    handle = chain(t.add.s(1, 1), t.add.s(2)).apply_async()
    first = _steps(pg, handle.workflow_id)["0.0"]["job_id"]
    token = _claim(pg, first)
    assert operator.cancel_workflow(pg, "jobs", first, actor="ops", reason="stop") == 0
    with pg.begin() as conn:
        assert _succeed(conn, first, token, 2)
    assert run_row(pg, first)["state"] == "succeeded"
    assert _run(pg, handle.job_id) is None


def test_migration_0014_down_and_up(tmp_path: Path) -> None:
    sqlite_then_postgres(tmp_path, "m0014", "workflow_id", "0013")


def _step_columns(names: set[str], url: str) -> set[str]:
    """Which of ``names`` the database at ``url`` has as columns of workflow_steps."""
    engine = make_engine(url)
    try:
        return names & {c["name"] for c in inspect(engine).get_columns(STEPS.name)}
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("revision", "below", "column"),
    [
        ("0020", "0019", "members_left"),
        ("0031", "0030", "lineage"),
        ("0032", "0031", "countdown"),
        ("0033", "0032", "shadow"),
    ],
)
def test_a_migration_of_workflow_steps_goes_down_and_up(
    tmp_path: Path, revision: str, below: str, column: str
) -> None:
    present = partial(_step_columns, {column})
    each_dialect_down_and_up(tmp_path, f"m{revision}", below, present, {column})


def test_a_canvas_under_task_always_eager_runs_here_as_celerys_does(pg: Engine) -> None:
    t.add.app.conf.task_always_eager = True
    try:
        assert chain(t.add.s(1, 2), t.add.s(3)).apply_async().get() == 6
        assert group(t.add.s(i, i) for i in range(3)).apply_async().get() == [0, 2, 4]
        assert chord([t.add.s(1, 1), t.add.s(2, 2)], t.tsum.s()).apply_async().get() == 6
    finally:
        t.add.app.conf.task_always_eager = False
    with pg.connect() as conn:  # each call a run of its own, through the journal
        states = conn.execute(select(JOBS.table.c.state)).scalars().all()
    assert states == ["succeeded"] * 8
