"""``python -m tests.conformance.driver bare|ours [idiom ...]``: run the idioms (all, or
those named) against one app, several at once, and print their answers as one JSON object.

A process of its own: the program side of an app is configured from its environment, as a
Django view or a script of a team would be, and sees none of the test process's calls."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.conformance.programs import PROGRAMS, Side

AT_ONCE = 12


def side(which: str) -> Side:
    if which == "bare":
        from tests.conformance import bare_app

        return Side(bare_app.app, bare_app.TASKS, "bare")
    from jobsapp.celery_app import app
    from tests.conformance import lifecycle_tasks

    return Side(app, lifecycle_tasks.TASKS, "conf")


def answer(s: Side, name: str) -> Any:
    program, _ = PROGRAMS[name]
    try:
        return program(s)
    except Exception as exc:  # noqa: BLE001 - a program that breaks is an answer too
        return ["the program raised", type(exc).__name__, str(exc)[:300]]


def main(argv: Sequence[str]) -> int:
    s = side(argv[0])
    names = list(argv[1:]) or list(PROGRAMS)
    with ThreadPoolExecutor(AT_ONCE) as pool:
        answers = dict(zip(names, pool.map(lambda n: answer(s, n), names), strict=True))
    print(json.dumps(answers, default=repr, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
