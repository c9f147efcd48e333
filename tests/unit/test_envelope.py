"""The checks a task message passes before Celery's consumer may read it."""

from __future__ import annotations

from typing import Any

import pytest

from jobsapp.lifecycle.transport.envelope import body_fault, header_fault


def headers(**changes: Any) -> dict[str, Any]:
    """What Celery 5's own producer sends, changed; a value of ... drops the header."""
    base: dict[str, Any] = {
        "lang": "py",
        "task": "tests.echo",
        "id": "3f1c",
        "root_id": "3f1c",
        "parent_id": None,
        "group": None,
        "shadow": None,
        "eta": None,
        "expires": None,
        "retries": 0,
        "timelimit": [None, None],
        "argsrepr": "()",
        "kwargsrepr": "{}",
        "origin": "gen1@host",
        "ignore_result": True,
        "stamped_headers": None,
        "stamps": {},
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not ...}


@pytest.mark.parametrize(
    "good",
    [
        headers(),
        headers(timelimit=[30, 60.5]),
        headers(eta="2026-11-30T12:00:00+00:00", expires="2026-11-30T12:00:00"),
        headers(timelimit=None, retries=3, group="g", group_index=0, shadow="alias"),
        headers(lang=..., root_id=..., origin=..., argsrepr=..., kwargsrepr=...),
        headers(unknown_header=[1, {"x": None}]),
    ],
)
def test_what_celery_itself_sends_passes(good: dict[str, Any]) -> None:
    assert header_fault(good) is None


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (["task", "id"], "headers are a list, not a mapping"),
        (None, "headers are null, not a mapping"),
        (headers(task=...), "no task header (protocol 1 messages are not accepted)"),
        (headers(task=["tests.echo"]), "task header is a list, not a string"),
        (headers(id=...), "no id header"),
        (headers(id=None), "id header is null, not a task id"),
        (headers(id=""), "id header is an empty string, not a task id"),
        (headers(id=7), "id header is an int, not a task id"),
        (headers(timelimit="10"), "timelimit header is a str, not [soft, hard] seconds"),
        (headers(timelimit=[1, 2, 3]), "timelimit header is a list, not [soft, hard] seconds"),
        (headers(timelimit=[-1, None]), "timelimit header is a list, not [soft, hard] seconds"),
        (headers(timelimit=[True, None]), "timelimit header is a list, not [soft, hard] seconds"),
        (headers(eta="tomorrow"), "eta header is a str, not an ISO 8601 time"),
        (headers(expires=5), "expires header is an int, not an ISO 8601 time"),
        (headers(retries="1"), "retries header is a str, not a count"),
        (headers(retries=True), "retries header is a bool, not a count"),
        (headers(shadow=["x"]), "shadow header is a list, not a string"),
        (headers(ignore_result="yes"), "ignore_result header is a str, not a boolean"),
        (headers(stamped_headers=[1]), "stamped_headers header is a list, not a list of strings"),
        (headers(stamps=[]), "stamps header is a list, not a mapping"),
    ],
)
def test_a_header_celery_would_trip_on_is_named(bad: Any, reason: str) -> None:
    assert header_fault(bad) == reason


def test_an_unknown_task_is_celerys_to_answer_once_its_headers_are_sound() -> None:
    """Celery's own handler of unknown tasks (which the guard extends) reads the id: a
    message without one must not reach it; a sound one of any task name may."""
    assert header_fault(headers(task="tests.nope", id=...)) == "no id header"
    assert header_fault(headers(task="tests.nope")) is None


EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


@pytest.mark.parametrize(
    "good", [[[], {}, EMBED], ([1], {"a": 1}, None), [[], {}, {}], [[], {}, {"chain": [{}]}]]
)
def test_a_protocol_2_body_passes(good: Any) -> None:
    assert body_fault(good) is None


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("just a string", "body is a str, not [args, kwargs, embed]"),
        (None, "body is null, not [args, kwargs, embed]"),
        ([[], {}], "body is a list, not [args, kwargs, embed]"),
        ({"args": []}, "body is a dict, not [args, kwargs, embed]"),
        (b"\x00", "body is a bytes, not [args, kwargs, embed]"),
        ([None, {}, None], "args are null, not a list"),
        ([[], [], None], "kwargs are a list, not a mapping"),
        ([[], {}, 7], "embed is an int, not a mapping"),
        ([[], {}, {"callbacks": "x"}], "embed callbacks is a str, not a list"),
        ([[], {}, {"chord": []}], "embed chord is a list, not a mapping"),
    ],
)
def test_a_body_celery_would_trip_on_is_named(bad: Any, reason: str) -> None:
    assert body_fault(bad) == reason
