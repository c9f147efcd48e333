"""Django: the user's rows, the run row and the outbox row in one ``transaction.atomic()``.

Runs the example project (examples/django_app) on the examples' PostgreSQL database
(jobsapp's migrations, then Django's), with the Redis broker and a real in-process worker.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from django.db import connections, transaction
from django.test import Client
from sqlalchemy import Engine, create_engine, func, select

from jobsapp.contrib.django import enqueue
from jobsapp.lifecycle import JobHandle
from jobsapp.lifecycle.journal.tables import JobRun
from jobsapp.lifecycle.transport import outbox
from tests.integration.frameworks.conftest import queued_messages
from tests.support.databases import use_database
from tests.support.journal_view import outbox_rows, run_count, run_row
from tests.support.waiting import eventually

T = TypeVar("T")


class Boom(Exception):
    """Raised inside an atomic block to roll it back."""


def rolled_back(body: Callable[[], T]) -> T:
    """Run ``body`` in ``transaction.atomic()``, then roll it back; returns what it returned."""
    returned: list[T] = []

    def run() -> None:
        with transaction.atomic():
            returned.append(body())
            raise Boom

    with pytest.raises(Boom):
        run()
    return returned[0]


@pytest.fixture
def db(django_db: str) -> Iterator[Engine]:
    """The examples' database, with Django's tables migrated and the orders emptied."""
    from examples.django_app.shop.models import Order

    Order.objects.all().delete()
    yield use_database(django_db)
    connections.close_all()


def job_rows(engine: Engine, job_id: uuid.UUID) -> tuple[int, int]:
    """(run rows, outbox rows) of ``job_id``, read from a connection of jobsapp's own."""
    table = JobRun.__table__
    with engine.connect() as conn:
        runs = conn.execute(select(func.count()).where(table.c.job_id == job_id)).scalar_one()
    return runs, len(outbox_rows(engine, job_id))


def test_djangos_connection_handed_to_connection_commits_the_job_alone(
    db: Engine, redis_clean: None
) -> None:
    """The bug the issue names: the obvious bridge ends Django's transaction early."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    from examples.django_app.shop.models import Order
    from examples.django_app.shop.tasks import send_receipt

    driver = "psycopg" if is_psycopg3 else "psycopg2"
    bridge = create_engine(
        f"postgresql+{driver}://", creator=lambda: connections["default"].connection
    )

    def enqueue_then_order() -> JobHandle:
        with bridge.begin() as conn:
            handle = send_receipt.apply_async(kwargs={"order_id": 1}, connection=conn)
        Order.objects.create(customer="ada", total_cents=100)
        return handle

    handle = rolled_back(enqueue_then_order)
    assert Order.objects.count() == 0
    assert job_rows(db, handle.job_id) == (1, 1)


def test_commit_keeps_order_run_and_outbox_and_publishes_only_then(
    db: Engine, redis_clean: None
) -> None:
    from examples.django_app.shop.models import Order
    from examples.django_app.shop.tasks import send_receipt

    with transaction.atomic():
        order = Order.objects.create(customer="ada", total_cents=100)
        with transaction.atomic():
            handle = enqueue(send_receipt, kwargs={"order_id": order.pk})
        again = enqueue(send_receipt, kwargs={"order_id": order.pk}, job_id=handle.job_id)
        assert job_rows(db, handle.job_id) == (0, 0), "visible before COMMIT"
        assert queued_messages() == 0, "published before the outermost COMMIT"
    assert again.outcome.value == "duplicate"
    assert Order.objects.filter(pk=order.pk).exists()
    assert job_rows(db, handle.job_id) == (1, 1)
    assert queued_messages() == 1
    outbox.MARKER.flush()  # the fast path marks its rows in bulk, a moment after publishing
    assert outbox_rows(db, handle.job_id)[0]["published_at"] is not None


def test_a_worker_runs_the_committed_job(db: Engine, worker: object) -> None:
    from examples.django_app.shop.models import Order
    from examples.django_app.shop.tasks import send_receipt

    with transaction.atomic():
        order = Order.objects.create(customer="ada", total_cents=100)
        handle = enqueue(send_receipt, kwargs={"order_id": order.pk})
    assert handle.settled(timeout=60)["state"] == "succeeded"
    order.refresh_from_db()
    assert order.receipt_sent


def test_rollback_leaves_no_order_no_job_no_message(db: Engine, redis_clean: None) -> None:
    from examples.django_app.shop.models import Order
    from examples.django_app.shop.tasks import send_receipt

    def order_and_enqueue() -> JobHandle:
        order = Order.objects.create(customer="ada", total_cents=100)
        return enqueue(send_receipt, kwargs={"order_id": order.pk})

    handle = rolled_back(order_and_enqueue)
    assert Order.objects.count() == 0
    assert job_rows(db, handle.job_id) == (0, 0)
    assert run_count(db) == 0
    assert queued_messages() == 0


def test_rolled_back_savepoint_drops_its_job_and_keeps_the_outer_one(
    db: Engine, redis_clean: None
) -> None:
    from examples.django_app.shop.models import Order
    from examples.django_app.shop.tasks import send_receipt

    with transaction.atomic():
        kept = Order.objects.create(customer="ada", total_cents=100)
        outer = enqueue(send_receipt, kwargs={"order_id": kept.pk})

        def second_order() -> JobHandle:
            lost = Order.objects.create(customer="bob", total_cents=200)
            return enqueue(send_receipt, kwargs={"order_id": lost.pk})

        inner = rolled_back(second_order)  # a nested atomic(): a savepoint
    assert list(Order.objects.values_list("customer", flat=True)) == ["ada"]
    assert job_rows(db, outer.job_id) == (1, 1)
    assert job_rows(db, inner.job_id) == (0, 0)
    assert queued_messages() == 1


def test_order_view_commits_the_order_and_its_receipt(db: Engine, worker: object) -> None:
    from examples.django_app.shop.models import Order

    response = Client().post("/orders/", {"customer": "ada", "total_cents": "250"})
    assert response.status_code == 201, response.content
    order = Order.objects.get(pk=response.json()["order"])
    eventually(lambda: Order.objects.get(pk=order.pk).receipt_sent, timeout=60)
    # The body's effect commits before the worker writes the run's finish: wait for that.
    job_id = uuid.UUID(response.json()["job_id"])
    eventually(lambda: run_row(db, job_id)["state"] in {"succeeded", "failed"})
    assert run_row(db, job_id)["state"] == "succeeded"
