"""The workflows of the canvas chaos test (test_canvas_chaos.py): their tasks and producer.

Workers import this module (``JOBSAPP_IMPORTS``). Each body first appends ``job_id
attempt`` to the file ``JOBSAPP_TEST_CANVAS_LOG`` names, one ``O_APPEND`` write that a
SIGKILL cannot tear, so the test can compare every run of a body with the attempts the
journal recorded. In every third workflow one step fails its first attempt on purpose
(``flaky``): its retry, under kills too, must redo that step only. Run as ``python -m
tests.chaos.canvas_work CHAINS CHORDS`` it is the producer: it sends the canvases and
prints one JSON line per workflow.
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
from jobsapp.lifecycle import RetryPolicy, current_run, lifecycle_task

LOG_ENV = "JOBSAPP_TEST_CANVAS_LOG"
# Long enough that a kill often lands inside a body, short enough for a quick CI run.
BODY_SECONDS = 0.05
CHAIN_INCREMENTS = (1, 10, 100, 1000)
CHORD_MEMBERS = 5
# Where a workflow's flaky step sits in its canvas (see is_flaky).
FLAKY_PATHS = {"chain": "0.1", "chord": "0.h.0"}
QUICK_RETRY = RetryPolicy(base_delay=0.3, max_delay=1.0, jitter=0.0)


def _note(*, flaky: bool = False) -> None:
    ctx = current_run()
    fd = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.job_id} {ctx.attempt}\n".encode())
    finally:
        os.close(fd)
    time.sleep(BODY_SECONDS)
    if flaky and ctx.attempt == 1:
        raise ConnectionError("a flaky step's first attempt fails")


@lifecycle_task(app, name="tests.chaos.step", retry_policy=QUICK_RETRY)
def step(x: int, inc: int, flaky: bool = False) -> int:
    _note(flaky=flaky)
    return x + inc


@lifecycle_task(app, name="tests.chaos.total", retry_policy=QUICK_RETRY)
def total(values: list[int]) -> int:
    _note()
    return sum(values)


def is_flaky(n: int) -> bool:
    """Whether workflow ``n`` has a flaky step: its chain's second step, its chord's first
    member."""
    return n % 3 == 0


def chain_of(n: int) -> tuple[Any, int]:
    """A chain of four steps from ``n``, and what its last step returns."""
    first, second, *rest = CHAIN_INCREMENTS
    flaky = step.s(second, flaky=is_flaky(n))
    canvas = chain(step.s(n, first), flaky, *(step.s(inc) for inc in rest))
    return canvas, n + sum(CHAIN_INCREMENTS)


def chord_of(n: int) -> tuple[Any, int]:
    """A chord of five members and a body, and what its body returns."""
    members = [step.s(n, k, flaky=k == 0 and is_flaky(n)) for k in range(CHORD_MEMBERS)]
    canvas = chord(members, total.s())
    return canvas, CHORD_MEMBERS * n + sum(range(CHORD_MEMBERS))


def produce(chains: int, chords: int) -> None:
    """Send the canvases, interleaved, printing kind, workflow id, final job and value."""
    kinds = [("chain", chain_of, n) for n in range(chains)]
    kinds += [("chord", chord_of, n) for n in range(chords)]
    kinds.sort(key=lambda k: k[2])
    for kind, build, n in kinds:
        canvas, expected = build(n)
        handle = canvas.apply_async()
        print(
            json.dumps(
                {
                    "kind": kind,
                    "workflow_id": str(handle.workflow_id),
                    "final": str(handle.job_id),
                    "expected": expected,
                    "flaky": is_flaky(n),
                }
            ),
            flush=True,
        )


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tests.chaos.canvas_work CHAINS CHORDS", file=sys.stderr)
        return 2
    produce(int(argv[0]), int(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
