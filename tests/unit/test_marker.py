"""The publish marker: its thread, its exit flush, and a forked child's own list."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, create_engine

from jobsapp.lifecycle.journal.outbox_queries import Accepted
from jobsapp.lifecycle.transport.marker import Marker
from tests.support.waiting import eventually

ENGINE = create_engine("sqlite://")  # a key only: nothing connects
LONG = 3600.0  # the thread never flushes by itself within a test


def _row(outbox_id: int) -> Accepted:
    return Accepted(outbox_id, 0, timedelta(minutes=5), datetime(2026, 1, 1, tzinfo=UTC))


class Recorder:
    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __call__(self, engine: Engine, accepted: Sequence[Accepted]) -> None:
        assert engine is ENGINE
        self.calls.append([a.id for a in accepted])


def test_the_thread_marks_what_was_added_in_one_write() -> None:
    written = Recorder()
    marker = Marker(written, interval=1.0)
    marker.add(ENGINE, [_row(1), _row(2)])
    marker.add(ENGINE, [_row(3)])
    eventually(lambda: written.calls, timeout=10)
    assert written.calls == [[1, 2, 3]]


def test_a_forked_child_never_marks_its_parents_rows() -> None:
    written = Recorder()
    marker = Marker(written, interval=LONG)
    marker.add(ENGINE, [_row(1)])
    os.register_at_fork(after_in_child=marker.after_fork_in_child)
    pid = os.fork()
    if pid == 0:  # the child: nothing of the parent's to mark, and its own rows are marked
        marker.add(ENGINE, [_row(2)])
        os._exit(0 if marker.flush() == 1 and written.calls == [[2]] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert marker.flush() == 1
    assert written.calls == [[1]]


def test_rows_collected_before_a_normal_exit_are_marked() -> None:
    script = textwrap.dedent("""
        from jobsapp.lifecycle.transport.marker import Marker
        from tests.unit.test_marker import ENGINE, LONG, _row

        Marker(lambda engine, rows: print("marked", [r.id for r in rows]), LONG)\\
            .add(ENGINE, [_row(7), _row(8)])
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=os.getcwd(),
    )
    assert done.stdout.strip() == "marked [7, 8]"


def test_importing_the_app_hooks_nothing_into_exit_or_celery_signals() -> None:
    """The marker hooks itself in at its first row: a process that only imports jobsapp
    (a web worker, a CLI command) runs no flush at exit and no receiver at a child's exit."""
    script = textwrap.dedent("""
        from celery.signals import worker_process_shutdown
        import jobsapp, jobsapp.celery_app
        from jobsapp.lifecycle.transport import outbox

        print(len(worker_process_shutdown.receivers))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["0"]
