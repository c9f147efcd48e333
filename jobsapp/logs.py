"""Every log handler the app configures masks secrets, tracebacks included.

``log.exception`` and Celery's own "Task ... raised unexpected" lines carry the exception's
text and traceback, which may hold a database URL, an AWS secret or a bearer token. A
filter on each handler (not on a logger: records of child loggers skip their parents'
filters) scrubs the finished message, the traceback and the stack with
``lifecycle.scrub`` and the secret values of the process's environment.

``JOBSAPP_LOG_FORMAT=json`` gives every such handler (worker, beat, web, gunicorn's error
and access logs) a formatter of one JSON object per line, with the job's and the trace's
ids as fields, and the exception as ``exc_type``, ``exc_message`` and ``exc_info`` (the
traceback). It formats what the filter left: the scrubbed message and traceback, never the
raw arguments. What Celery would print outside logging (the worker's and beat's banners)
becomes a record or is left out, so that every line is JSON.

The filter also removes terminal escapes (colours, cursor moves) from messages: a log
line is read by tools and people long after the terminal that coloured it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import traceback
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Final

from celery import Celery

from jobsapp.lifecycle.rules.errors import Logged
from jobsapp.lifecycle.rules.scrub import known_secrets_from_env, scrub
from jobsapp.lifecycle.transport import tracing
from jobsapp.settings import get_settings

# Tracebacks of chained exceptions run to several thousand characters; keep them whole.
_LIMIT: Final = 32_000
FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"
FORMATS: Final = ("text", "json")

# OSC sequences (window titles, links), CSI sequences (colours, cursor moves) and the
# two-byte escapes.
_ESCAPES: Final = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]"
)

# The job a worker thread is running: job_id, attempt, module and task of its records.
_job: ContextVar[Mapping[str, str | int] | None] = ContextVar("jobsapp_log_job", default=None)


class ScrubFilter(logging.Filter):
    """Replaces a record's message, traceback and stack by their scrubbed text."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self._secrets = tuple(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self._scrub(record.getMessage())
        record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            # exc_info stays: Sentry's logging integration reads it after the handlers ran.
            # Formatters render exc_text when it is set, so they print the scrubbed text.
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip()
            record.exc_message = self._scrub(str(record.exc_info[1]))
        if record.exc_text:
            record.exc_text = self._scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = self._scrub(record.stack_info)
        return True

    def _scrub(self, text: str) -> str:
        return _ESCAPES.sub("", scrub(text, limit=_LIMIT, secrets=self._secrets))


class _LoggedRejects(logging.Filter):
    """Drops Celery's line about a reject jobsapp already logged (``errors.Logged``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, Logged)


_ONE_LINE = _LoggedRejects()


def one_line_per_reject() -> None:
    """Celery's tracer logs every ``Reject`` at WARNING; jobsapp's refusals have their own
    line already (idempotent)."""
    logging.getLogger("celery.app.trace").addFilter(_ONE_LINE)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the job and the trace."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **(_job.get() or {}),
        }
        trace_id = tracing.current_trace_id()
        if trace_id is not None:
            line["trace_id"] = trace_id
        if record.exc_info and record.exc_info[0] is not None:
            kind = record.exc_info[0]
            line["exc_type"] = f"{kind.__module__}.{kind.__qualname__}"
            line["exc_message"] = getattr(record, "exc_message", None) or str(record.exc_info[1])
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        return json.dumps(line, default=str)


@contextmanager
def about_job(**fields: str | int) -> Iterator[None]:
    """Records logged inside carry ``fields`` (job_id, attempt, module, task) in JSON."""
    token = _job.set(fields)
    try:
        yield
    finally:
        _job.reset(token)


def format_handlers(*loggers: logging.Logger) -> None:
    """With ``JOBSAPP_LOG_FORMAT=json``, every handler of ``loggers`` writes JSON lines."""
    if get_settings().log_format != "json":
        return
    for logger in loggers:
        for handler in logger.handlers:
            handler.setFormatter(JsonFormatter())


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
    # Python's warnings are printed to stderr otherwise, a line no log pipeline parses.
    logging.captureWarnings(True)
    scrub_handlers(logging.getLogger())
    format_handlers(logging.getLogger())


def log_worker_banner(worker: Any) -> None:
    """With JSON lines, the worker's banner (printed, not logged) becomes one record."""
    if get_settings().log_format != "json":
        return
    worker.quiet = True
    banner = f"{worker.startup_info(artlines=False)}\n{worker.extra_info() or ''}"
    logging.getLogger("celery.apps.worker").info("%s", _ESCAPES.sub("", banner).strip())


def json_startup(app: Celery) -> None:
    """With JSON lines, what a Celery process writes before its logging is set up: beat
    prints no banner (it starts by logging what it runs), and Python's warnings (Celery
    warns of a worker run as root) are JSON records."""
    if get_settings().log_format != "json":
        return
    _quiet_beat(app)
    logging.captureWarnings(True)
    warnings = logging.getLogger("py.warnings")
    if not warnings.handlers:
        warnings.addHandler(logging.StreamHandler())
        warnings.propagate = False  # Celery's root handler, once set up, would repeat it
        scrub_handlers(warnings)
        format_handlers(warnings)


def _quiet_beat(app: Celery) -> None:
    printing = app.Beat

    class Beat(printing):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "quiet": True})

    # A cached property of the app: set per app, it is what `celery beat` instantiates.
    app.Beat = Beat  # type: ignore[misc]
