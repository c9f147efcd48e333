"""Importing jobsapp patches nothing of Celery's: the canvas classes are routed through
the journal only when a lifecycle task joins an app (issue 31, "Import side effects")."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import celery.canvas as canvas
from celery import Celery
before = {cls: cls.apply_async for cls in (canvas._chain, canvas.group, canvas.chord)}
untouched = lambda: all(cls.apply_async is f for cls, f in before.items())

import jobsapp.lifecycle, jobsapp.lifecycle.task, jobsapp.lifecycle.workflows.canvas
print("after import", untouched())

app = Celery("setup")
def add(x, y):
    return x + y
jobsapp.lifecycle.lifecycle_task(app, name="setup.add")(add)
print("after a lifecycle task joined an app", untouched())
"""


def test_importing_jobsapp_leaves_celerys_canvas_alone_until_an_app_declares_a_task() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True, timeout=60
    )
    assert ran.stdout.splitlines() == [
        "after import True",
        "after a lifecycle task joined an app False",
    ]
