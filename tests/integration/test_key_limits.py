"""``limit=N`` and ``fair``: a key's slots in the journal (journal/key_slots.py), on both dialects.

What a user checks: how many runs of a key may start (their messages published), which
ones wait (parked: no message, no worker), that a freed slot goes to the oldest waiter,
that duplicates by job_id are still one job and that nothing over the limit is skipped.
The many-host measurement is tests/e2e/test_key_limits_hosts.py.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Engine, select

from jobsapp import operator
from jobsapp.celery_app import app
from jobsapp.lifecycle import EnqueueOutcome, journal
from jobsapp.lifecycle.journal import registry
from jobsapp.lifecycle.journal.key_slots import PARKED, SLOTS
from jobsapp.lifecycle.worker import key_limits
from jobsapp.maintenance import slot_sweep
from jobsapp.web.app import create_app
from tests.support import limit_tasks
from tests.support.attachments import environment
from tests.support.journal_view import outbox_rows, run_row
from tests.support.migrations import sqlite_then_postgres
from tests.support.procs import BIN, WORKER_FLAGS, Launcher, launching, ready
from tests.support.tasks import counter
from tests.support.waiting import eventually
from tests.support.web import TOKEN, log_in


def _enqueue(tenant: str, n: int, seconds: float = 0.0) -> list[uuid.UUID]:
    handles = [limit_tasks.limited_plain.apply_async((tenant, seconds)) for _ in range(n)]
    assert {h.outcome for h in handles} == {EnqueueOutcome.ENQUEUED}
    return [h.job_id for h in handles]


def _parked(db: Engine, job_id: uuid.UUID) -> bool:
    run, (message,) = run_row(db, job_id), outbox_rows(db, job_id)
    return bool(run["next_retry_at"] == PARKED and message["available_at"] == PARKED)


def _slots(db: Engine, tenant: str) -> dict[uuid.UUID, Any]:
    with db.connect() as conn:
        rows = conn.execute(
            select(SLOTS.c.job_id, SLOTS.c.slot_no).where(SLOTS.c.concurrency_key == tenant)
        ).all()
    return {job_id: slot_no for job_id, slot_no in rows}


def test_a_limited_key_publishes_n_runs_and_parks_the_rest_in_arrival_order(
    db: Engine, redis_clean: None
) -> None:
    jobs = _enqueue("t1", 5)
    other = _enqueue("t2", 1)
    assert [_parked(db, j) for j in jobs] == [False, False, False, True, True]
    assert sorted(s for s in _slots(db, "t1").values() if s is not None) == [0, 1, 2]
    assert _slots(db, "t2") == {other[0]: 0}
    assert all(run_row(db, j)["state"] == "queued" for j in jobs)
    # Over the limit is a wait, never a skip; the same job_id is still one job.
    again = limit_tasks.limited_plain.apply_async(("t1", 0.0), job_id=jobs[4])
    assert again.outcome == EnqueueOutcome.DUPLICATE
    # A stray message of a waiting run (a duplicate publish) starts nothing.
    with db.begin() as conn:
        assert journal.claim(conn, registry.JOBS, jobs[4], 1, worker="w") is None


def _succeed_and_release(db: Engine, job_id: uuid.UUID) -> journal.key_slots.Granted:
    """A worker's claim, then its success and the slot's release in one transaction."""
    spec = registry.JOBS
    with db.begin() as conn:
        claimed = journal.claim(conn, spec, job_id, 1, worker="w1")
        assert claimed is not None
        assert journal.succeed(conn, spec, job_id, 1, token=claimed.claimed_token, actor="w1")
        return journal.key_slots.release(conn, spec, job_id)


def test_a_freed_slot_goes_to_the_oldest_waiter_in_the_finishing_transaction(
    db: Engine, redis_clean: None
) -> None:
    jobs = _enqueue("t1", 5)
    granted = _succeed_and_release(db, jobs[1])
    assert granted.job_ids == {jobs[3]}
    assert [m.job_id for m in granted.messages] == [jobs[3]]
    assert [_parked(db, j) for j in jobs[2:]] == [False, False, True]
    assert _slots(db, "t1")[jobs[3]] == 1  # the slot jobs[1] held


def test_a_run_granted_a_slot_is_published_at_its_jobs_priority(
    db: Engine, redis_clean: None
) -> None:
    handles = [
        limit_tasks.limited_plain.apply_async(("t1", 0.0), priority=7)
        for _ in range(limit_tasks.LIMIT + 1)
    ]
    jobs = [h.job_id for h in handles]
    granted = _succeed_and_release(db, jobs[0])
    assert [(m.job_id, m.priority) for m in granted.messages] == [(jobs[-1], 7)]


def test_the_sweep_frees_the_slot_of_a_run_cancelled_while_queued(
    db: Engine, redis_clean: None
) -> None:
    jobs = _enqueue("t1", 4)
    with db.begin() as conn:
        assert journal.cancel(
            conn, registry.JOBS, jobs[0], attempts=0, actor="operator", reason="test"
        )
    assert _parked(db, jobs[3])
    assert slot_sweep.run_once(app, db) == {"slots_freed": 1, "slots_granted": 1}
    assert not _parked(db, jobs[3])
    assert set(_slots(db, "t1")) == set(jobs[1:])


def test_the_reapers_fail_frees_the_slot_for_the_oldest_waiter(
    db: Engine, redis_clean: None
) -> None:
    jobs = _enqueue("t1", 4)
    spec = registry.JOBS
    with db.begin() as conn:
        assert journal.claim(conn, spec, jobs[0], 1, worker="w") is not None
    later = datetime.now(UTC) + timedelta(hours=1)
    with db.begin() as conn:
        stale = journal.find_stale(conn, spec, cutoff=later, limit=10)
        reaped = journal.reap(
            conn,
            spec,
            stale,
            requeue_them=False,
            cutoff=later,
            reason="stale",
            now=datetime.now(UTC),
        )
    assert [r.job_id for r in reaped] == [jobs[0]]
    assert not _parked(db, jobs[3])
    assert set(_slots(db, "t1")) == set(jobs[1:])


def test_a_fair_run_lets_its_keys_next_run_be_published_once_claimed(
    db: Engine, redis_clean: None
) -> None:
    handles = [limit_tasks.fair_tenant.apply_async(("A", 0.0)) for _ in range(3)]
    jobs = [h.job_id for h in handles]
    assert [_parked(db, j) for j in jobs] == [False, False, True]
    spec = registry.JOBS
    with db.begin() as conn:
        row = journal.claim(conn, spec, jobs[0], 1, worker="w")
    assert row is not None
    key_limits.after_fair_claim(app, db, spec, row)
    assert not _parked(db, jobs[2])
    assert set(_slots(db, "A")) == set(jobs[1:])


def test_limited_runs_all_finish_with_a_worker_and_leave_no_slot(
    db: Engine, worker: object
) -> None:
    jobs = _enqueue("t1", 7, 0.05) + _enqueue("t2", 2)
    eventually(lambda: all(run_row(db, j)["state"] == "succeeded" for j in jobs), timeout=60)
    assert (_slots(db, "t1"), _slots(db, "t2")) == ({}, {})


@pytest.mark.parametrize("task", [limit_tasks.limited_lineage, limit_tasks.fair_lineage])
def test_a_run_another_runs_worker_publishes_is_its_own_root_as_celery_has_it(
    db: Engine, worker: object, task: Any
) -> None:
    # Called from outside any task: Celery roots each call at itself, with no parent. A
    # key's later runs are published by the worker that frees (or claims) its slot, inside
    # another run's task, which Celery's send_task would take for their parent.
    tenant = f"lineage-{uuid.uuid4().hex[:8]}"
    handles = [task.apply_async((tenant,)) for _ in range(4)]
    seen = [h.get(timeout=30) for h in handles]
    assert seen == [[h.id, None] for h in handles]


def test_a_body_that_commits_its_own_success_hands_its_slot_on_too(
    db: Engine, worker: object
) -> None:
    handles = [limit_tasks.limited_completing.apply_async(("t3",)) for _ in range(5)]
    jobs = [h.job_id for h in handles]
    eventually(lambda: all(run_row(db, j)["state"] == "succeeded" for j in jobs), timeout=30)
    assert _slots(db, "t3") == {}


def test_a_revoked_running_run_lets_go_of_its_slot_as_it_stops(db: Engine, worker: object) -> None:
    looping = [limit_tasks.limited_looping.apply_async(("t4", 60.0)) for _ in range(2)]
    quick = [limit_tasks.limited_looping.apply_async(("t4", 0.0)) for _ in range(2)]
    # Two slots loop (the in-process worker has two threads), the third one's run waits
    # for a thread, the fourth for a slot.
    eventually(lambda: all(run_row(db, h.job_id)["state"] == "running" for h in looping))
    assert _parked(db, quick[1].job_id)
    app.control.revoke(str(looping[0].job_id), terminate=True)
    eventually(lambda: run_row(db, looping[0].job_id)["outcome"] == "cancelled")
    eventually(lambda: all(run_row(db, h.job_id)["state"] == "succeeded" for h in quick))
    app.control.revoke(str(looping[1].job_id), terminate=True)
    # No relay runs here: only the cancel's own transaction can have freed the slots.
    eventually(lambda: _slots(db, "t4") == {})


def test_the_queues_page_shows_each_limited_keys_slots_and_waiting_runs(
    db: Engine, redis_clean: None
) -> None:
    _enqueue("t1", 5)
    _enqueue("t2", 1)
    with environment(JOBSAPP_ADMIN_TOKEN=TOKEN):
        client = create_app().test_client()
        assert log_in(client, "http://admin.local")[0] == 303
        page = client.get("/admin/queues", base_url="http://admin.local").get_data(as_text=True)
    table = page.split('id="keys"', 1)[1].split("</table>", 1)[0]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in table.split("<tr>")[2:]]
    shown = [(module, key, n, held, waiting) for module, key, n, held, waiting, _ in rows]
    assert shown == [("jobs", "t1", "3", "3", "2"), ("jobs", "t2", "3", "1", "0")]


@pytest.fixture
def held_workers(pg: Engine, redis_clean: None, tmp_path: Path) -> Iterator[Launcher]:
    """Two worker processes of two children each on ``limited_held``'s queue: room for
    one run more than the key's limit, so only the limit can hold the extra one back."""
    counter().delete(limit_tasks.HELD_QUEUE)
    imports = f"{os.environ['JOBSAPP_IMPORTS']},tests.support.limit_tasks"
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "JOBSAPP_IMPORTS": imports,
    }
    with launching(env, tmp_path) as launcher:
        ready(
            *(
                launcher.start(
                    f"held{i}",
                    [
                        str(BIN / "celery"),
                        "-A",
                        "jobsapp",
                        "worker",
                        *WORKER_FLAGS,
                        "-c",
                        "2",
                        "-Q",
                        limit_tasks.HELD_QUEUE,
                        "-n",
                        f"held{i}-{uuid.uuid4().hex[:6]}@%h",
                    ],
                )
                for i in range(2)
            ),
            timeout=90,
        )
        yield launcher


def _holding(pg: Engine, tenant: str, token: str) -> list[uuid.UUID]:
    """``LIMIT`` runs of ``tenant``, each running its body and holding its slot."""
    holders = [
        limit_tasks.limited_held.delay(tenant, token).job_id for _ in range(limit_tasks.LIMIT)
    ]
    eventually(lambda: len(limit_tasks.started(token)) == limit_tasks.LIMIT, timeout=60)
    return holders


def _arrival(pg: Engine, job_id: uuid.UUID, token: str) -> str:
    """What became of one run more than the limit: it ``waits`` for a slot (parked), or
    ``started`` its body beside the holders."""

    def seen() -> str:
        if str(job_id) in limit_tasks.started(token):
            return "started"
        with pg.connect() as conn:
            run = journal.load(conn, registry.JOBS, job_id)
        if run is None or run.next_retry_at != PARKED:
            return ""
        newest = outbox_rows(pg, job_id)[-1]
        return "waits" if newest["available_at"] == PARKED else ""

    return eventually(seen, timeout=60)


def _all_ran_within_the_limit(pg: Engine, token: str, jobs: list[uuid.UUID]) -> None:
    limit_tasks.let_go(token)
    eventually(lambda: all(run_row(pg, j)["state"] == "succeeded" for j in jobs), timeout=90)
    assert limit_tasks.started(token) == {str(j) for j in jobs}
    assert limit_tasks.most_at_once(token) == limit_tasks.LIMIT


def test_an_operators_replay_of_a_limited_job_waits_for_a_slot(
    held_workers: Launcher, pg: Engine
) -> None:
    tenant, token = uuid.uuid4().hex, uuid.uuid4().hex
    limit_tasks.arm_failure(token)
    failed = limit_tasks.limited_held.delay(tenant, token).job_id
    eventually(lambda: run_row(pg, failed)["state"] == "failed", timeout=60)
    holders = _holding(pg, tenant, token)
    replayed = operator.replay(pg, "jobs", failed, actor="test", reason="once more", app=app)
    assert _arrival(pg, failed, token) == "waits"
    assert (replayed.attempt, replayed.published, replayed.waiting) == (2, False, True)
    _all_ran_within_the_limit(pg, token, [*holders, failed])
    assert run_row(pg, failed)["attempts"] == 2


def test_a_foreign_message_of_a_limited_task_waits_for_a_slot(
    held_workers: Launcher, pg: Engine
) -> None:
    """A plain Celery ``send_task`` (no journal row): the worker adopts it into its key's
    line instead of claiming it by insert beside the holders."""
    tenant, token = uuid.uuid4().hex, uuid.uuid4().hex
    holders = _holding(pg, tenant, token)
    elsewhere = Celery("elsewhere", broker=app.conf.broker_url)
    sent = elsewhere.send_task(
        limit_tasks.limited_held.name, (tenant, token), queue=limit_tasks.HELD_QUEUE
    )
    foreign = uuid.UUID(sent.id)
    assert _arrival(pg, foreign, token) == "waits"
    _all_ran_within_the_limit(pg, token, [*holders, foreign])
    assert run_row(pg, foreign)["attempts"] == 1


def test_migration_0016_goes_down_and_up_again_on_both_dialects(tmp_path: Path) -> None:
    sqlite_then_postgres(tmp_path, "key_slots", "key_limit", below="0015")
