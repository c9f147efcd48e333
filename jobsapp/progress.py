"""Progress of a long operator command: a bar on a terminal, plain lines otherwise.

A person at a terminal watches one bar move (rich); a pipe, a log file or a supervisor
gets one flushed line per step, which is what ``grep`` and ``tail -f`` want.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

# done, total, the step's plain line
Update = Callable[[int, int, str], None]


def _plain(stream: TextIO) -> Update:
    def update(_done: int, _total: int, line: str) -> None:
        stream.write(line + "\n")
        stream.flush()

    return update


@contextmanager
def progress_bar(title: str, stream: TextIO | None = None) -> Iterator[Update]:
    """``update(done, total, line)``: moves the bar on a terminal, prints ``line`` elsewhere."""
    stream = stream or sys.stdout
    if not stream.isatty():
        yield _plain(stream)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(file=stream)) as bar:
        task = bar.add_task(title, total=None)
        yield lambda done, total, _line: bar.update(task, completed=done, total=total)


@contextmanager
def working(title: str, stream: TextIO | None = None) -> Iterator[None]:
    """A spinner with the elapsed time on a terminal while a step of unknown length runs;
    nothing elsewhere (the step prints its own result)."""
    stream = stream or sys.stdout
    if not stream.isatty():
        yield
        return
    from rich.console import Console

    with Console(file=stream).status(title):
        yield
