"""The workflows of the canvas chaos test (test_canvas_chaos.py): their tasks and producer.

Workers import this module (``JOBSAPP_IMPORTS``). Each body first appends ``job_id
attempt`` to the file ``JOBSAPP_TEST_CANVAS_LOG`` names, one ``O_APPEND`` write that a
SIGKILL cannot tear, so the test can compare every run of a body with the attempts the
journal recorded. Run as ``python -m tests.chaos.canvas_work CHAINS CHORDS`` it is the
producer: it sends the canvases and prints one JSON line per workflow.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from celery import chain, chord

from jobsapp.celery_app import app
from jobsapp.lifecycle import current_run, lifecycle_task

LOG_ENV = "JOBSAPP_TEST_CANVAS_LOG"
# Long enough that a kill often lands inside a body, short enough for a quick CI run.
BODY_SECONDS = 0.05
CHAIN_INCREMENTS = (1, 10, 100, 1000)
CHORD_MEMBERS = 5


def _note() -> None:
    ctx = current_run()
    fd = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.job_id} {ctx.attempt}\n".encode())
    finally:
        os.close(fd)
    time.sleep(BODY_SECONDS)


@lifecycle_task(app, name="tests.chaos.step")
def step(x: int, inc: int) -> int:
    _note()
    return x + inc


@lifecycle_task(app, name="tests.chaos.total")
def total(values: list[int]) -> int:
    _note()
    return sum(values)


def chain_of(n: int) -> tuple[Any, int]:
    """A chain of four steps from ``n``, and what its last step returns."""
    first, *rest = CHAIN_INCREMENTS
    canvas = chain(step.s(n, first), *(step.s(inc) for inc in rest))
    return canvas, n + sum(CHAIN_INCREMENTS)


def chord_of(n: int) -> tuple[Any, int]:
    """A chord of five members and a body, and what its body returns."""
    canvas = chord([step.s(n, k) for k in range(CHORD_MEMBERS)], total.s())
    return canvas, CHORD_MEMBERS * n + sum(range(CHORD_MEMBERS))


def produce(chains: int, chords: int) -> None:
    """Send the canvases, interleaved, printing kind, workflow id, final job and value."""
    kinds = [("chain", chain_of, n) for n in range(chains)]
    kinds += [("chord", chord_of, n) for n in range(chords)]
    kinds.sort(key=lambda k: k[2])
    for kind, build, n in kinds:
        canvas, expected = build(n)
        handle = canvas.apply_async()
        print(json.dumps({"kind": kind, "workflow_id": str(handle.workflow_id),
                          "final": str(handle.job_id), "expected": expected}),
              flush=True)  # fmt: skip


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tests.chaos.canvas_work CHAINS CHORDS", file=sys.stderr)
        return 2
    produce(int(argv[0]), int(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
