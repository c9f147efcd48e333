"""The profile benchmark's pure part: whose code a profiled function's time is counted to."""

from __future__ import annotations

import pytest

from bench.profiling import package_of

SITE = "/work/main/.venv/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    ("filename", "function", "package"),
    [
        (f"{SITE}/kombu/messaging.py", "publish", "kombu"),
        (f"{SITE}/sqlalchemy/engine/base.py", "execute", "sqlalchemy"),
        # A C method: only its name says whose it is.
        ("~", "<method 'execute' of 'psycopg2.extensions.cursor' objects>", "psycopg2"),
        ("~", "<built-in method time.perf_counter>", "other"),
        # jobsapp from this checkout or from an older commit's worktree.
        ("/work/main/jobsapp/lifecycle/journal.py", "enqueue_new", "jobsapp"),
        ("/tmp/bench-profile-x/tree/jobsapp/lifecycle/task.py", "apply_async", "jobsapp"),
        (f"{SITE}/billiard/pool.py", "apply_async", "other"),
        ("/usr/lib/python3.11/threading.py", "wait", "other"),
    ],
)
def test_each_function_counts_to_its_package(filename: str, function: str, package: str) -> None:
    assert package_of(filename, function) == package
