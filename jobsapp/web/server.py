"""The web process's gunicorn worker: gunicorn's threads (``gthread``), with a deadline for
reading each request, so that slow clients cannot hold the web.

gunicorn's sync workers serve one connection each: four clients sending a byte every two
seconds held both workers of the Procfile's web, and ``/healthz`` timed out. Here a
process serves ``threads`` connections at once; idle keep-alive connections wait in
gunicorn's poller, not in a thread. A thread still blocks while it reads a request, so
every request is read against a deadline: its headers within ``HEADERS_WITHIN`` seconds,
its body within ``JOBSAPP_WEB_READ_TIMEOUT`` seconds after them. Past it the connection's
reading side is shut (the blocked read returns at once, as if the client had stopped
sending), the request fails (an upload answers 408) and the thread is free again. Writing
the answer is not bounded here: the variant route redirects to S3 in production, and a
buffering proxy in front is the answer to clients that read slowly.

Uploads are also bounded per process (``JOBSAPP_UPLOAD_CONCURRENCY``, web/app.py), so
uploads in flight never take every thread.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

# gunicorn has no type hints: its worker is Any to mypy.
from gunicorn.workers.gthread import ThreadWorker  # type: ignore[import-untyped]

from jobsapp.settings import get_settings

# A request line and headers are a few hundred bytes: a client that needs longer is
# holding the thread, not sending a request.
HEADERS_WITHIN = 10.0
_TICK = 0.25


class Deadlines:
    """Connections whose request must be read by a time; a thread of its own cuts the
    reading side of the late ones. Every call is thread-safe."""

    def __init__(self, tick: float = _TICK, clock: Callable[[], float] = time.monotonic) -> None:
        self._due: dict[int, tuple[float, Any]] = {}
        self._lock = threading.Lock()
        self._tick, self._clock = tick, clock
        self._thread: threading.Thread | None = None

    @contextmanager
    def watch(self, conn: Any, seconds: float) -> Iterator[None]:
        """``conn`` (anything with a ``sock``) is cut if still watched after ``seconds``."""
        self._start()
        self.extend(conn, seconds)
        try:
            yield
        finally:
            with self._lock:
                self._due.pop(id(conn), None)

    def extend(self, conn: Any, seconds: float) -> None:
        """A new deadline for a watched ``conn``, ``seconds`` from now."""
        with self._lock:
            self._due[id(conn)] = (self._clock() + seconds, conn)

    def cut_late(self) -> int:
        """Shut the reading side of every connection past its deadline; how many."""
        now = self._clock()
        with self._lock:
            late = [key for key, (due, _) in self._due.items() if due <= now]
            conns = [self._due.pop(key)[1] for key in late]
        for conn in conns:
            _shut_reading(conn.sock)
        return len(conns)

    def _start(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="jobsapp-read-deadlines", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self._tick)
            self.cut_late()


def _shut_reading(sock: socket.socket) -> None:
    # Closed meanwhile (OSError): its request ended on its own.
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RD)


class Worker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's ``gthread`` worker, whose requests are read against deadlines."""

    def init_process(self) -> None:
        self.deadlines = Deadlines()
        self.body_within = get_settings().web_read_timeout
        super().init_process()

    def handle(self, conn: Any) -> Any:
        # From the thread's first wait for the request to the end of its answer.
        with self.deadlines.watch(conn, HEADERS_WITHIN):
            return super().handle(conn)

    def handle_request(self, req: Any, conn: Any) -> Any:
        # The headers are in: the body has its own time.
        self.deadlines.extend(conn, self.body_within)
        return super().handle_request(req, conn)
