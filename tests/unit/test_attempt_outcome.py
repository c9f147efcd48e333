"""What a failed attempt stores, and the Celery state each attempt ending maps to (pure)."""

from __future__ import annotations

import json
import pickle
import traceback
import uuid

import pytest
from celery.exceptions import Retry
from celery.utils.threads import LocalStack

from jobsapp.lifecycle.rules.errors import RetryRequested
from jobsapp.lifecycle.rules.failures import TRACEBACK_LIMIT, failure_detail
from jobsapp.lifecycle.rules.message import Envelope, task_id_for
from jobsapp.lifecycle.task import AttemptFailed, LifecycleTask
from jobsapp.lifecycle.worker.attempt import End, Ended
from jobsapp.lifecycle.worker.celery_view import NotRun
from jobsapp.lifecycle.worker.claim import Refusal
from jobsapp.lifecycle.worker.delivery import call_body, reported
from tests.support.runs import a_run

# A delivery under a task id of its own, not an attempt's: its result is what it did.
TASK_ID = "a-task-id-of-its-own"

SECRET = "s3cr3t-v4lue-for-the-scrubber"


def _deep(n: int) -> None:
    if n == 0:
        raise ValueError(f"password={SECRET} " + "x" * 20_000)
    _deep(n - 1)


def _caught(call: object) -> BaseException:
    try:
        call()  # type: ignore[operator]
    except Exception as exc:  # noqa: BLE001 - the test inspects any exception
        return exc
    raise AssertionError("no exception")


def test_a_deep_traceback_is_scrubbed_and_bounded_keeping_the_innermost_frame() -> None:
    detail = failure_detail(_caught(lambda: _deep(200)), (SECRET,))
    assert detail["type"] == "builtins.ValueError"
    assert len(detail["traceback"]) <= TRACEBACK_LIMIT
    assert "_deep(n - 1)" in detail["traceback"]
    assert SECRET not in repr(detail)


class _Opaque:
    def __repr__(self) -> str:
        return "<Opaque>"


def test_an_exceptions_arguments_are_kept_as_celerys_json_results_keep_them() -> None:
    carried = ValueError({"field": "email", "codes": [7, 8], SECRET: SECRET}, _Opaque(), 1.5)
    detail = failure_detail(carried, (SECRET,))
    assert detail["args"][0]["field"] == "email"
    assert detail["args"][0]["codes"] == [7, 8]
    assert detail["args"][1:] == ["<Opaque>", 1.5]
    assert SECRET not in json.dumps(detail)


def test_arguments_json_cannot_hold_are_kept_as_their_repr_or_not_at_all() -> None:
    nan = failure_detail(ValueError(float("nan"), {1: "int key"}), ())
    assert nan["args"] == ["nan", "{1: 'int key'}"]
    json.loads(json.dumps(nan["args"], allow_nan=False))  # Postgres's json takes it
    nested: list[object] = []
    nested.append(nested)
    assert isinstance(failure_detail(ValueError(nested), ())["args"], list)
    assert "args" not in failure_detail(ValueError(["x" * 1000] * 20), ())


def test_celery_retry_stores_the_exception_it_wraps() -> None:
    detail = failure_detail(RetryRequested(KeyError("k"), None), ())
    assert detail["type"] == "builtins.KeyError"


def _envelope(attempt: int) -> Envelope:
    return Envelope(
        job_id=uuid.uuid4(),
        module="jobs",
        attempt=attempt,
        ids={},
        outbox_id=1,
        traceparent=None,
        concurrency_key=None,
    )


def test_a_requeued_attempt_is_a_retry_naming_the_next_attempts_task() -> None:
    env = _envelope(3)
    with pytest.raises(Retry) as raised:
        reported(env, Ended(End.REQUEUED, "ValueError: boom"), TASK_ID)
    assert task_id_for(env.job_id, 4) in _formatted(raised.value.exc)
    assert "ValueError: boom" in str(raised.value.exc)


def _formatted(exc: BaseException | None) -> str:
    assert exc is not None
    return "".join(traceback.format_exception(exc))


class PaymentDeclined(Exception):
    pass


def _body(card: str) -> None:
    raise PaymentDeclined(f"card {card} declined, token={SECRET}")


def _through_the_task(error: BaseException | None = None) -> Ended:
    """An attempt's end as ``run_attempt`` returns it: the body's exception caught in
    jobsapp's frames (here one that calls the body through ``call_body``)."""
    task = LifecycleTask()
    task.run = _body  # type: ignore[method-assign]
    task.request_stack = LocalStack()  # as Celery's binding to an app gives it
    try:
        run = a_run(attempts=2, params={"args": ["4242"], "kwargs": {}})
        call_body(task, run, str(run.job_id), (str(run.job_id), None, None))
    except PaymentDeclined as exc:
        error = exc
    return Ended(End.FAILED, "permanent: PaymentDeclined: ...", error=error)


def test_a_failed_attempt_shows_celery_the_bodys_exception_frames_and_job() -> None:
    """What Flower reads of a FAILURE: ``repr`` of the exception and its formatted
    traceback, in the worker's main process after the pickle across the pool."""
    env = _envelope(2)
    with pytest.raises(AttemptFailed) as raised:
        reported(env, _through_the_task(), TASK_ID)
    crossed = pickle.loads(pickle.dumps(raised.value))  # noqa: S301 - our own bytes
    assert repr(crossed) == repr(raised.value)
    assert repr(crossed).startswith("PaymentDeclined('card 4242 declined, token=")
    text = _formatted(raised.value)
    assert SECRET not in text + repr(crossed)
    assert f"{__name__}.PaymentDeclined: card 4242 declined" in text
    frames = traceback.extract_tb(raised.value.__traceback__)
    # Below jobsapp's frame that raises it (the report), the body's frames only.
    assert [f.name for f in frames][-1] == "_body"
    assert "call_body" not in [f.name for f in frames]
    assert f"job {env.job_id} attempt 2" in text


@pytest.mark.parametrize(
    ("end", "event"), [(End.CANCELLED, "task-revoked"), (End.LEASE_LOST, None)]
)
def test_an_attempt_its_delivery_did_not_end_is_no_success_of_its_task(
    end: End, event: str | None
) -> None:
    """Under the attempt's own task id, a revoke's stop is REVOKED, and a lease lost sends
    nothing (the reaper sent what it decided); Celery's task-succeeded would outrank both."""
    env = _envelope(1)
    with pytest.raises(NotRun) as raised:
        reported(env, Ended(end, "stopped"), task_id_for(env.job_id, 1))
    assert raised.value.event == event


@pytest.mark.parametrize(
    ("refusal", "event"),
    [
        (Refusal.TERMINAL, None),
        (Refusal.REQUEUED, "task-retried"),
        (Refusal.UNSTARTED, "task-revoked"),
    ],
)
def test_a_copy_of_an_attempt_of_a_terminal_job_tells_that_attempts_own_end(
    refusal: Refusal, event: str | None
) -> None:
    """Celery lets a task-received replace RETRY (and an attempt that never ran has no end
    event): a broker's copy of such an attempt read RECEIVED for good. The attempt that
    ended the job sends nothing: its own SUCCESS, FAILURE or REVOKED outranks RECEIVED."""
    env = _envelope(1)
    with pytest.raises(NotRun) as raised:
        reported(env, refusal, task_id_for(env.job_id, 1))
    assert raised.value.event == event


def test_an_exception_of_several_arguments_reads_as_celery_shows_it() -> None:
    """Flower's exception column is ``repr`` of the raised exception: Celery's reads
    ``ValueError('never', 7, {'k': [1, 2]})``; the attempt's read the arguments as one
    string, ``ValueError("('never', 7, {'k': [1, 2]})")``."""
    error = ValueError("never", 7, {"k": [1, 2], "token": SECRET})
    with pytest.raises(AttemptFailed) as raised:
        reported(_envelope(1), Ended(End.FAILED, "permanent", error=error), TASK_ID)
    crossed = pickle.loads(pickle.dumps(raised.value))  # noqa: S301 - our own bytes
    assert repr(crossed) == repr(raised.value)
    assert repr(crossed).startswith("ValueError('never', 7, {'k': [1, 2], 'token': ")
    assert SECRET not in repr(crossed)


def test_a_failed_attempt_raises_its_scrubbed_error_and_others_say_what_happened() -> None:
    env = _envelope(1)
    with pytest.raises(AttemptFailed, match="exhausted: ValueError: boom"):
        reported(env, Ended(End.FAILED, "exhausted: ValueError: boom"), TASK_ID)
    assert reported(env, Ended(End.SUCCEEDED, value={"total": 3}), TASK_ID) == {"total": 3}
    lost = reported(env, Ended(End.LEASE_LOST, "finish refused"), TASK_ID)
    assert lost.endswith("lease lost: finish refused")
    assert reported(env, Refusal.TERMINAL, TASK_ID).startswith("not run")
