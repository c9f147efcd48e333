"""A bound on the work one web process does at once: a request beyond it is refused at
once (503 with ``Retry-After``), never queued.

The bound is per process, shared by its threads: gunicorn's workers are processes, so a
host admits up to ``workers x limit`` at once, and a worker at its limit refuses even
while another has room (the kernel, not jobsapp, picks which worker accepts a
connection); the client's retry lands wherever the kernel sends it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Busy(Exception):
    """Every slot is held; the request is refused, not queued."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"{limit} held")
        self.limit = limit


class Slots:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a bound of {limit} admits nothing")
        self.limit = limit
        self._free = threading.BoundedSemaphore(limit)

    @contextmanager
    def held(self) -> Iterator[None]:
        """One slot for the block, or ``Busy`` at once when none is free."""
        if not self._free.acquire(blocking=False):
            raise Busy(self.limit)
        try:
            yield
        finally:
            self._free.release()
