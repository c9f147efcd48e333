"""Celery's idioms on each broker (Redis; RabbitMQ with publisher confirms): bare Celery and
lifecycle tasks, the same answers (real prefork workers, beat running;
tests/conformance/programs.py).

One module, one broker's deployments after the other: the two sides of one broker are two
prefork workers, beat and two drivers, and two brokers' at once beside the rest of the suite
starved a program past its waits (bare Celery's too)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.check import same_answer
from tests.conformance.deployment import Answers, side_by_side
from tests.conformance.programs import PROGRAMS
from tests.support.env import service

pytestmark = pytest.mark.timeout(600)

BROKER_URLS = {"redis": "JOBSAPP_TEST_REDIS_URL", "rabbitmq": "JOBSAPP_TEST_AMQP_URL"}


@pytest.fixture(
    scope="module",
    params=[pytest.param("redis"), pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)],
)
def answers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Answers]:
    broker: str = request.param
    url = service(BROKER_URLS[broker])
    with side_by_side(broker, url, tmp_path_factory.mktemp(f"conformance-{broker}")) as found:
        yield found


@pytest.mark.parametrize("idiom", list(PROGRAMS))
def test_answers_as_celery(answers: Answers, idiom: str) -> None:
    same_answer(answers, idiom)
