"""``celery`` for a process under libfaketime with real monotonic clocks.

With monotonic clocks faked, libfaketime (0.9.10) hangs timed waits (``Event.wait``);
with them real (``FAKETIME_DONT_FAKE_MONOTONIC=1``), its ``clock_nanosleep`` fails with
EINVAL, which Python's ``time.sleep`` uses. ``select()`` sleeps correctly under both, so
it stands in for ``time.sleep`` here; the wall clock (what the tests skew) stays faked.
"""

from __future__ import annotations

import select
import sys
import time
from pathlib import Path


def faketime(offset: str) -> list[str]:
    """The argv prefix that runs a command under libfaketime moved by ``offset``, as the
    ``faketime -f`` wrapper does, but without the wrapper: it keeps a semaphore and a shared
    memory segment named by its pid in /dev/shm, which a killed worker leaves behind, and a
    later wrapper that gets the same pid fails to start ("faketime: sem_open: File exists");
    an offset needs neither."""
    (library,) = Path("/usr/lib").glob("*/faketime/libfaketime.so.1")
    return ["env", f"LD_PRELOAD={library}", f"FAKETIME={offset}"]


def _sleep(seconds: float) -> None:
    select.select([], [], [], max(0.0, seconds))


if __name__ == "__main__":
    time.sleep = _sleep
    from celery.__main__ import main

    sys.exit(main())
