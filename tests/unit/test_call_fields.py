"""Flower's args and kwargs of an attempt (``celery_view.call_fields``): what Celery's
producer would show (``saferepr``), scrubbed, whether a part is empty or not."""

from __future__ import annotations

from typing import Any

import pytest
from celery.utils.saferepr import saferepr

from jobsapp.lifecycle.rules.scrub import scrub
from jobsapp.lifecycle.worker.celery_view import REPR_MAX, call_fields

SECRETS = ("hunter2-very-secret",)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),
        ((), {"attachment_id": "3f2a", "pipeline_version": 1}),
        ((1, "two"), {}),
        (("hunter2-very-secret",), {"password": "x", "nested": {"token": "t"}}),
        (("x" * 5000,), {"long": ["y"] * 2000}),
    ],
)
def test_each_part_is_saferepr_then_scrub(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    shown = call_fields(args, kwargs, SECRETS)

    assert shown == {
        "args": scrub(saferepr(args, REPR_MAX), secrets=SECRETS),
        "kwargs": scrub(saferepr(kwargs, REPR_MAX), secrets=SECRETS),
    }
    assert "hunter2-very-secret" not in shown["args"] + shown["kwargs"]
