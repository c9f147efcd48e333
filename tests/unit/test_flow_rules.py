"""Flow control's rules that need no server: rates as written, and the options refused."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task
from jobsapp.lifecycle.flow.gating import Rate, parse_rate, publishable
from jobsapp.lifecycle.journal import PendingMessage


@pytest.mark.parametrize(
    ("text", "rate", "interval"),
    [
        ("10/s", Rate(10, 1.0), 0.1),
        ("100/m", Rate(100, 60.0), 0.6),
        ("5/30s", Rate(5, 30.0), 6.0),
        ("1/h", Rate(1, 3600.0), 3600.0),
        (" 3 / d ", Rate(3, 86400.0), 28800.0),
    ],
)
def test_a_rate_is_a_count_over_a_period(text: str, rate: Rate, interval: float) -> None:
    assert parse_rate(text) == rate
    assert parse_rate(text).interval == pytest.approx(interval)


@pytest.mark.parametrize("text", ["", "10", "0/s", "-1/s", "10/w", "ten/s", "10/1.5s"])
def test_a_rate_that_says_nothing_clear_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        parse_rate(text)


def test_celerys_per_worker_rate_limit_is_refused_with_what_to_use() -> None:
    with pytest.raises(TypeError, match=r"rate_limit is per worker process.*rate='100/m'"):
        lifecycle_task(
            app, name="tests.flow.local_cap", rate_limit="10/s", lazy=False, shared=False
        )(_body)


def test_a_bad_rate_is_refused_when_the_task_is_declared() -> None:
    with pytest.raises(ValueError, match="rate"):
        lifecycle_task(app, name="tests.flow.bad_rate", rate="fast", lazy=False, shared=False)(
            _body
        )


def test_a_rate_key_naming_no_argument_is_refused_when_the_task_is_declared() -> None:
    with pytest.raises(TypeError, match=r"rate_key names \['tenant'\]"):
        lifecycle_task(
            app,
            name="tests.flow.bad_key",
            rate="1/s",
            rate_key="{tenant}",
            lazy=False,
            shared=False,
        )(_body)


def _body() -> None:
    """A task body. ``lazy=False`` builds the task class (and runs its checks) at once;
    ``shared=False`` keeps a refused declaration from being retried at every finalize."""


def test_the_fast_path_publishes_when_the_pauses_cannot_be_read() -> None:
    """The enqueue has committed; a database gone since cannot make it fail."""
    gone = create_engine("postgresql+psycopg2://postgres@127.0.0.1:1/none")
    messages = [
        PendingMessage(
            1, uuid.uuid4(), 1, "t", {"module": "jobs"}, datetime.now(UTC), 0, 0, queue=None
        )
    ]
    assert publishable(gone, lambda: "celery", messages) == messages
