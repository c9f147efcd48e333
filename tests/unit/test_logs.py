"""The scrubbing filter on log handlers: messages, arguments and tracebacks."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from celery.app.log import TaskFormatter
from celery.utils.log import ColorFormatter

from jobsapp.logs import ScrubFilter, scrub_handlers

SECRET = "Zq7xW2pL9vK4"
KNOWN = "configured-secret-value"


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger whose one handler (Celery's formatter) writes to a buffer, scrubbed."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(ColorFormatter("%(levelname)s %(message)s", use_color=False))
    handler.addFilter(ScrubFilter([KNOWN]))
    logger = logging.getLogger(f"test_logs.{id(out)}")
    logger.addHandler(handler)
    logger.propagate = False
    yield logger, out
    logger.removeHandler(handler)


def _fail() -> None:
    cause = OSError(f"connect to postgresql://app:{SECRET}@db/jobs failed")
    raise ConnectionError(f"Authorization: Bearer {SECRET}; and {KNOWN}") from cause


def test_an_exception_and_its_cause_are_masked_in_the_traceback(
    logged: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = logged
    try:
        _fail()
    except ConnectionError:
        logger.exception("call failed with password=%s", SECRET)
    text = out.getvalue()
    assert SECRET not in text
    assert KNOWN not in text
    assert text.startswith("ERROR call failed with password=***\n")
    assert "The above exception was the direct cause" in text
    assert "OSError: connect to postgresql://app:***@db/jobs failed" in text
    assert "ConnectionError: Authorization: Bearer ***" in text
    assert 'in _fail\n    raise ConnectionError(f"Authorization' in text


def test_celery_task_records_are_masked_too(logged: tuple[logging.Logger, io.StringIO]) -> None:
    """Celery's "raised unexpected" line: a dict of arguments and the task formatter."""
    logger, out = logged
    logger.handlers[0].setFormatter(TaskFormatter("%(task_name)s %(message)s", use_color=False))
    context = {"name": "t", "id": "1", "exc": f"ValueError('redis://:{SECRET}@cache')"}
    logger.error("Task %(name)s[%(id)s] raised unexpected: %(exc)s", context)
    assert out.getvalue() == "??? Task t[1] raised unexpected: ValueError('redis://:***@cache')\n"


def test_a_record_seen_by_two_handlers_is_scrubbed_once_and_alike() -> None:
    first, second = io.StringIO(), io.StringIO()
    logger = logging.getLogger("test_logs.two")
    logger.propagate = False
    # Its own level: an in-process worker earlier in the session leaves the root's raised.
    logger.setLevel(logging.INFO)
    for out in (first, second):
        logger.addHandler(logging.StreamHandler(out))
    scrub_handlers(logger)
    scrub_handlers(logger)  # idempotent: one filter per handler
    assert [len(h.filters) for h in logger.handlers] == [1, 1]
    logger.warning("token=%s", SECRET)
    assert first.getvalue() == second.getvalue() == "token=***\n"
