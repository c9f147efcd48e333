"""A thread keeps its autocommit connection between one-statement writes (jobsapp/held.py):
the same server session for its statements, never one in use twice, never a forked
parent's, and none kept past the server losing it."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from jobsapp.db import autocommit, make_engine, relaxed_autocommit

SESSION_PID = text("SELECT pg_backend_pid()")


@pytest.fixture
def engine(postgres_url: str) -> Iterator[Engine]:
    # A URL of the module's own: the held connections are per URL, per process.
    made = make_engine(f"{postgres_url}?application_name=held-connections")
    yield made
    made.dispose()


def _session(
    engine: Engine, use: Callable[[Engine], AbstractContextManager[Connection]] = autocommit
) -> int:
    with use(engine) as conn:
        return int(conn.execute(SESSION_PID).scalar_one())


def _in_thread(fn: Callable[[], int]) -> int:
    found: list[int] = []
    worker = threading.Thread(target=lambda: found.append(fn()))
    worker.start()
    worker.join(timeout=30)
    return found[0]


def test_a_threads_statements_share_one_session_and_threads_do_not(engine: Engine) -> None:
    mine = _session(engine)
    assert _session(engine) == mine
    assert _in_thread(lambda: _session(engine)) != mine
    # The relaxed variant is a pool of its own, held the same way.
    relaxed = _session(engine, relaxed_autocommit)
    assert _session(engine, relaxed_autocommit) == relaxed


def test_a_nested_block_gets_a_connection_of_its_own(engine: Engine) -> None:
    with autocommit(engine) as outer:
        outer_session = outer.execute(SESSION_PID).scalar_one()
        assert _session(engine) != outer_session
        assert outer.execute(SESSION_PID).scalar_one() == outer_session


def test_a_session_the_server_ends_fails_once_and_every_thread_then_has_a_new_one(
    engine: Engine, pg: Engine
) -> None:
    mine = _session(engine)
    # Another thread's held session, ended by the server too: SQLAlchemy's invalidation
    # of the pool at the first failure renews it before its next statement.
    other = threading.Event()
    theirs: list[int] = []
    go_on = threading.Event()

    def second_thread() -> None:
        theirs.append(_session(engine))
        other.set()
        go_on.wait(timeout=30)
        theirs.append(_session(engine))

    worker = threading.Thread(target=second_thread)
    worker.start()
    assert other.wait(timeout=30)
    with pg.begin() as admin:
        for pid in (mine, theirs[0]):
            admin.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    # As a pooled connection would: the statement on the lost session fails (no ping).
    with pytest.raises(DBAPIError) as lost:
        _session(engine)
    assert lost.value.connection_invalidated
    renewed = _session(engine)
    assert renewed != mine
    go_on.set()
    worker.join(timeout=30)
    assert len(theirs) == 2
    assert theirs[1] != theirs[0]


def test_a_forked_child_never_uses_its_parents_session(engine: Engine) -> None:
    mine = _session(engine)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through its exit code
        theirs = _session(engine)
        gc.collect()  # what the child let go of stays unclosed: the parent's socket
        os._exit(0 if theirs != mine else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _session(engine) == mine


def test_no_more_than_the_pool_size_is_held_and_an_ended_threads_is_let_go(
    engine: Engine,
) -> None:
    _session(engine)
    start, done = threading.Barrier(8), threading.Event()

    def busy_thread() -> None:
        start.wait(timeout=30)
        _session(engine)
        done.wait(timeout=30)

    threads = [threading.Thread(target=busy_thread) for _ in range(7)]
    for each in threads:
        each.start()
    start.wait(timeout=30)
    variant = engine_of_autocommit(engine)
    try:
        # This thread's and four of the seven; the rest checked out and in again.
        assert _eventually_checked_out(variant, 5)
    finally:
        done.set()
        for each in threads:
            each.join(timeout=30)
    # A new thread takes the place of the ended ones, whose connections go back: this
    # thread's and the new one's are held.
    _in_thread(lambda: _session(engine))
    assert variant.pool.checkedout() == 2  # type: ignore[attr-defined]


def engine_of_autocommit(engine: Engine) -> Engine:
    with autocommit(engine) as conn:
        return conn.engine


def _eventually_checked_out(variant: Engine, count: int) -> bool:
    for _ in range(300):
        if variant.pool.checkedout() == count:  # type: ignore[attr-defined]
            return True
        threading.Event().wait(0.01)
    return False
