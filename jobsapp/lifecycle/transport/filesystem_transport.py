"""kombu's filesystem transport (the embedded default's broker), its messages written whole.

kombu writes a message straight to its final name in the queue folder, and a consumer takes
any file of that name (it moves it away, then reads it) without waiting for the writer's
lock: a consumer that came between the writer's ``open`` and its ``write`` read an empty
file, and its ``JSONDecodeError`` stopped the worker's consumer (``celery inspect ping``
beside a worker on a loaded machine met it). Here a message is written under a name no
consumer takes (``PART`` after the queue's suffix) and renamed to its own once whole, so a
consumer sees a whole message or none; a writer that dies in between leaves a ``.part``
file no consumer reads (its job's outbox row is published again by the relay), which a
consumer removes once it is ``STALE`` old (a writer still alive after that long finds its
file gone, and its publish fails as a broker's would: the outbox row stays due). A file that
still cannot be parsed (a stray one, or one kombu's own writer left half-written) is
logged and dropped, as the Redis transport drops an item it cannot parse.
``jobsapp.celery_app`` selects ``Transport`` for ``filesystem://``.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from queue import Empty
from time import monotonic
from typing import Any, Final

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps

log = logging.getLogger(__name__)

_REFUSED: Final = "rejected message <unreadable> for <no task>: %s"
# After the queue's own suffix (``.{queue}.msg``), which is all a consumer takes.
PART: Final = ".part"
# A writer renames its file microseconds after it opens it: one this old lost its writer.
STALE: Final = 60.0


class Channel(filesystem.Channel):
    _swept = float("-inf")  # monotonic time of this channel's last sweep of stale files

    # kombu's stubs give its virtual channel and its filesystem channel two signatures.
    def _put(self, queue: str, message: Any, **_options: Any) -> None:  # type: ignore[override]
        """kombu's message file, renamed into the queue once written. Its name orders the
        queue as kombu's does: the milliseconds first."""
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        try:
            with open(final + PART, "wb", buffering=0) as part:
                part.write(dumps(message).encode())
            os.replace(final + PART, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue: str, timeout: float | None = None) -> Any:  # noqa: ARG002 - kombu passes none here
        if monotonic() - self._swept >= STALE:
            self._swept = monotonic()
            _sweep(self.data_folder_in)
        try:
            return super()._get(queue)
        except ValueError as exc:  # not JSON, not UTF-8: kombu moved the file away already
            log.error(_REFUSED, f"the message file cannot be parsed: {type(exc).__name__}")
            raise Empty from None


def _sweep(folder: str) -> None:
    """Removes the ``.part`` files of writers that stopped before their rename."""
    before = time.time() - STALE
    with os.scandir(folder) as entries:
        for entry in (each for each in entries if each.name.endswith(PART)):
            try:
                if entry.stat().st_mtime >= before:
                    continue
                os.unlink(entry.path)
            except FileNotFoundError:  # renamed by its writer, or another consumer's sweep
                continue
            log.warning("removed %s: its writer stopped before the message was whole", entry.name)


class Transport(filesystem.Transport):
    """Messages that appear in the queue whole; an unreadable file dropped with a line."""

    Channel = Channel
