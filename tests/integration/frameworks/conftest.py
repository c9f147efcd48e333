"""The framework examples' database: jobsapp's schema plus the examples' own tables.

A database of its own, so the examples' tables never show up in the schema-drift test
of the session's jobsapp database.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import Engine

from jobsapp.celery_app import app
from tests.support.databases import migrated_postgres, use_database
from tests.support.env import SESSION, service


@pytest.fixture(scope="session")
def examples_url() -> Iterator[str]:
    with migrated_postgres(f"jobsapp_examples_{SESSION}") as url:
        yield url


@pytest.fixture(scope="session")
def django_db(examples_url: str) -> str:
    """Django set up on the examples' database, its migrations applied beside jobsapp's."""
    import django
    from django.core.management import call_command

    os.environ["JOBSAPP_DATABASE_URL"] = examples_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "examples.django_app.settings"
    django.setup()
    call_command("migrate", verbosity=0)
    return examples_url


@pytest.fixture(scope="package", autouse=True)
def django_settings_stay_here() -> Iterator[None]:
    """Django's settings module is named in the environment for these tests only: a process
    another module starts (a worker in a folder without ``examples/``) must not inherit it."""
    yield
    os.environ.pop("DJANGO_SETTINGS_MODULE", None)


@pytest.fixture
def db(examples_url: str) -> Engine:
    """PostgreSQL only (overrides the two-dialect ``db``, and so the ``worker``'s)."""
    return use_database(examples_url)


def queued_messages() -> int:
    """Messages waiting on the broker (Redis keeps a queue as a list of its name)."""
    client = redis.Redis.from_url(service("JOBSAPP_TEST_REDIS_URL"))
    return int(client.llen(app.conf.task_default_queue))
