"""What each idiom's test asserts, the same on every broker."""

from __future__ import annotations

import json
from typing import Any

from tests.conformance.deployment import Answers
from tests.conformance.programs import DIFFERENT, PROGRAMS


def as_json(value: Any) -> Any:
    """An answer as the driver printed it (kombu's types by their repr)."""
    return json.loads(json.dumps(value, default=repr, sort_keys=True))


def same_answer(answers: Answers, idiom: str) -> None:
    """Bare Celery gives Celery's answer, and jobsapp gives the same one (or, where a
    guarantee requires another, the one docs/celery-compat.md states)."""
    _, expected = PROGRAMS[idiom]
    celerys = answers.celery[idiom]
    assert celerys == as_json(expected), f"bare Celery answered {celerys!r}"
    ours = as_json(DIFFERENT.get(idiom, expected))
    assert answers.jobsapp[idiom] == ours, (
        f"jobsapp answered {answers.jobsapp[idiom]!r}\n{answers.logs}"
    )
