"""Each failed attempt keeps its exception type, scrubbed message and scrubbed traceback on
its ``job_events`` row; ``last_error`` stays one line; the failure logs at WARNING/ERROR."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import Engine

from tests.support import tasks
from tests.support.journal_view import events
from tests.support.waiting import eventually


def test_each_failed_attempt_stores_its_scrubbed_exception(
    worker: object, db: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="jobsapp")
    token = "detail"
    row = tasks.leaky.delay(token).settled()
    assert (row["state"], row["outcome"]) == ("failed", "permanent")
    assert "\n" not in row["last_error"]
    failed = {e["transition"]: e for e in events(db, row["job_id"]) if e["detail"] is not None}
    assert set(failed) == {"retry", "fail"}
    retry, fail = failed["retry"]["detail"], failed["fail"]["detail"]
    assert (failed["retry"]["attempt"], failed["fail"]["attempt"]) == (1, 2)
    assert retry["type"] == "builtins.ConnectionError"
    assert fail["type"] == "jobsapp.lifecycle.rules.errors.PermanentError"
    assert "upstream refused us" in retry["message"]
    # The whole chain, innermost frame included: the body's own raise, and its cause.
    for detail in (retry, fail):
        assert "tests/support/tasks.py" in detail["traceback"]
        assert "OSError: connect to postgresql://app:***@db.internal" in detail["traceback"]
        assert len(detail["traceback"]) <= 8000
    stored = repr([retry, fail])
    for secret in tasks.planted_secrets(token).values():
        assert secret not in stored
    others = [e for e in events(db, row["job_id"]) if e["transition"] not in ("retry", "fail")]
    assert all(e["detail"] is None for e in others)

    def levels() -> set[int]:
        return {r.levelno for r in caplog.records if str(row["job_id"]) in r.getMessage()}

    # The worker logs the failure after its commit, which is what wait() saw.
    eventually(lambda: {logging.WARNING, logging.ERROR} <= levels())
