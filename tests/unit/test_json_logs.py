"""JOBSAPP_LOG_FORMAT=json: one scrubbed JSON object per record, with job and trace ids."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from jobsapp.lifecycle.transport import tracing
from jobsapp.logs import JsonFormatter, ScrubFilter, about_job, format_handlers
from jobsapp.settings import SettingsError, load_settings
from tests.support.attachments import environment

SECRET = "Zq7xW2pL9vK4"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger with one handler as a JSON-configured process has it: scrubbed, JSON."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(ScrubFilter([]))
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"test_json_logs.{id(out)}")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    yield logger, out
    logger.removeHandler(handler)


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_job_record_carries_its_ids_and_its_trace(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = logged
    job = {
        "job_id": "6f1b2f5e-3c1a-4f0e-9a57-1d6f3c2b8e40",
        "attempt": 2,
        "module": "jobs",
        "task": "tests.echo",
    }
    with tracing.span("run", {"traceparent": TRACEPARENT}, consumer=True), about_job(**job):
        logger.info("rendering %d variants", 3)
    logger.info("outside")
    inside, outside = lines(out)
    assert {k: inside[k] for k in job} == job
    assert inside["trace_id"] == TRACE_ID
    assert (inside["level"], inside["message"]) == ("INFO", "rendering 3 variants")
    assert "job_id" not in outside
    assert "trace_id" not in outside


def test_the_json_line_holds_the_scrubbed_message_and_traceback(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = logged
    try:
        raise ConnectionError(f"connect to postgresql://app:{SECRET}@db/jobs failed")
    except ConnectionError:
        logger.exception("call failed with password=%s", SECRET)
    assert SECRET not in out.getvalue()
    (line,) = lines(out)
    assert line["message"] == "call failed with password=***"
    assert "ConnectionError: connect to postgresql://app:***@db/jobs" in str(line["exc_info"])
    assert line["exc_type"] == "builtins.ConnectionError"
    assert line["exc_message"] == "connect to postgresql://app:***@db/jobs failed"


def test_the_record_keeps_its_exception_for_what_reads_it_after_the_handlers(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, _ = logged
    seen: list[logging.LogRecord] = []
    # What Sentry's logging integration does: it reads the record once the handlers ran.
    after = logging.Handler()
    after.emit = seen.append  # type: ignore[method-assign]
    logger.addHandler(after)
    try:
        try:
            raise ValueError("the body's own")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(after)
    (record,) = seen
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], ValueError)


def test_terminal_escapes_are_removed_from_messages_and_tracebacks(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = logged
    try:
        raise RuntimeError("\x1b[31mred\x1b[0m")
    except RuntimeError:
        logger.exception("\x1b[1;32mready\x1b[0m \x1b]0;title\x07")
    assert "\x1b" not in out.getvalue()
    (line,) = lines(out)
    assert line["message"] == "ready "
    assert "RuntimeError: red" in str(line["exc_info"])


def test_the_setting_picks_the_format_and_refuses_others() -> None:
    assert load_settings({}).log_format == "text"
    assert load_settings({"JOBSAPP_LOG_FORMAT": "JSON"}).log_format == "json"
    with pytest.raises(SettingsError, match="JOBSAPP_LOG_FORMAT"):
        load_settings({"JOBSAPP_LOG_FORMAT": "xml"})
    logger = logging.getLogger("test_json_logs.format")
    handler = logging.StreamHandler(io.StringIO())
    logger.addHandler(handler)
    try:
        with environment(JOBSAPP_LOG_FORMAT="json"):
            format_handlers(logger)
        assert isinstance(handler.formatter, JsonFormatter)
    finally:
        logger.removeHandler(handler)
