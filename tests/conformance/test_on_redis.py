"""Celery's idioms on a Redis broker: bare Celery and lifecycle tasks, the same answers
(real prefork workers, beat running; tests/conformance/programs.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.check import same_answer
from tests.conformance.deployment import Answers, side_by_side
from tests.conformance.programs import PROGRAMS
from tests.support.env import service

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Answers]:
    url = service("JOBSAPP_TEST_REDIS_URL")
    with side_by_side("redis", url, tmp_path_factory.mktemp("conformance-redis")) as found:
        yield found


@pytest.mark.parametrize("idiom", list(PROGRAMS))
def test_answers_as_celery_on_redis(answers: Answers, idiom: str) -> None:
    same_answer(answers, idiom)
