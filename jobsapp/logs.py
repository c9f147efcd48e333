"""Every log handler the app configures masks secrets, tracebacks included.

``log.exception`` and Celery's own "Task ... raised unexpected" lines carry the exception's
text and traceback, which may hold a database URL, an AWS secret or a bearer token. A
filter on each handler (not on a logger: records of child loggers skip their parents'
filters) scrubs the finished message, the traceback and the stack with
``lifecycle.scrub`` and the secret values of the process's environment.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Iterable
from typing import Final

from jobsapp.lifecycle.scrub import known_secrets_from_env, scrub

# Tracebacks of chained exceptions run to several thousand characters; keep them whole.
_LIMIT: Final = 32_000
FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"


class ScrubFilter(logging.Filter):
    """Replaces a record's message, traceback and stack by their scrubbed text."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self._secrets = tuple(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self._scrub(record.getMessage())
        record.args = None
        if record.exc_info:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip()
            record.exc_info = None  # formatters would render it again, unscrubbed
        if record.exc_text:
            record.exc_text = self._scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = self._scrub(record.stack_info)
        return True

    def _scrub(self, text: str) -> str:
        return scrub(text, limit=_LIMIT, secrets=self._secrets)


def scrub_handlers(*loggers: logging.Logger) -> None:
    """Put one ScrubFilter on every handler of ``loggers`` that has none yet."""
    secrets = known_secrets_from_env(os.environ)
    for logger in loggers:
        for handler in logger.handlers:
            if not any(isinstance(f, ScrubFilter) for f in handler.filters):
                handler.addFilter(ScrubFilter(secrets))


def configure(level: int = logging.INFO) -> None:
    """The command-line processes' logging (web, operator commands): root, scrubbed."""
    logging.basicConfig(level=level, format=FORMAT)
    scrub_handlers(logging.getLogger())
