"""A shape's copies are what Celery's ``as_task_v2`` builds for each call, and a first message
that holds a call's value where a copy would not put it is never copied."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import Celery

from jobsapp.lifecycle.transport.message_template import Call, Template

APP = Celery("template-test", set_as_current=False)


def _call(retries: int = 0, parent: str | None = None) -> Call:
    task_id = str(uuid.uuid4())
    body = {"job_id": str(uuid.uuid4()), "attempt": retries + 1}
    return Call(
        task_id=task_id,
        args=(),
        kwargs=body,
        retries=retries,
        root_id=parent,
        parent_id=parent,
        argsrepr=f"job_id={body['job_id']}",
        kwargsrepr=repr(body),
        headers={"traceparent": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"},
    )


def _celerys(call: Call) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The body, ``Producer.publish`` arguments and sent event Celery makes of ``call``,
    as ``send_task_message`` hands them on (its options for a direct queue)."""
    headers, properties, body, event = APP.amqp.as_task_v2(
        call.task_id,
        "tests.echo",
        call.args,
        call.kwargs,
        retries=call.retries,
        root_id=call.root_id,
        parent_id=call.parent_id,
        argsrepr=call.argsrepr,
        kwargsrepr=call.kwargsrepr,
        time_limit=30,
        create_sent_event=True,
    )
    headers.update(call.headers)
    publish = {
        "exchange": "",
        "routing_key": "celery",
        "serializer": "json",
        "declare": [],
        "headers": headers,
        **properties,
        "argsrepr": call.argsrepr,
        "kwargsrepr": call.kwargsrepr,
    }
    assert event is not None  # create_sent_event
    return body, publish, {**event, "queue": "celery", "exchange": "", "routing_key": "celery"}


# A fixed parent: xdist workers must collect the same test ids.
@pytest.mark.parametrize(
    ("retries", "parent"), [(0, None), (2, "9f361fb2-c01e-58db-8597-2c13532c8179")]
)
def test_a_copy_is_what_celery_builds_for_its_own_call(retries: int, parent: str | None) -> None:
    first = _call()
    template = Template.of(first, *_celerys(first))
    assert template is not None
    second = _call(retries, parent)
    body, publish, event = _celerys(second)
    assert template.message(second) == (body, publish)
    assert template.sent_event(second) == event


def test_a_first_message_holding_its_id_elsewhere_is_not_copied() -> None:
    """A Celery that adds a per-call field: a copy would carry the first call's value."""
    first = _call()
    body, publish, event = _celerys(first)
    publish["headers"]["task_id"] = first.task_id
    assert Template.of(first, body, publish, event) is None


def test_a_first_message_without_a_call_value_where_it_is_put_is_not_copied() -> None:
    first = _call(retries=1)
    body, publish, event = _celerys(first)
    publish["headers"]["retries"] = 0  # not this call's: the copy's would be wrong too
    assert Template.of(first, body, publish, event) is None
    body, publish, event = _celerys(first)
    event["uuid"] = str(uuid.uuid4())
    assert Template.of(first, body, publish, event) is None


def test_a_first_message_of_another_protocol_is_not_copied() -> None:
    first = _call()
    _, publish, event = _celerys(first)
    assert Template.of(first, {"args": [], "kwargs": first.kwargs}, publish, event) is None
