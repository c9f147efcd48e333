"""What a task or queue label may say: registered tasks and configured queues, else other."""

from __future__ import annotations

from jobsapp.monitor.labels import OTHER, Labels

LABELS = Labels(
    tasks={"shop.invoice": ("jobs", "billing"), "shop.mail": ("jobs", "celery")},
    queues=frozenset({"celery", "billing", "bulk"}),
    default_queue="celery",
)


def test_a_registered_task_keeps_its_name_any_other_is_folded() -> None:
    assert LABELS.task("shop.invoice") == "shop.invoice"
    assert LABELS.task("shop.invoice_v0") == OTHER


def test_a_configured_queue_keeps_its_name_any_other_is_folded() -> None:
    assert LABELS.queue("shop.mail", "bulk") == "bulk"
    assert LABELS.queue("shop.mail", "tenant-4711") == OTHER


def test_no_queue_is_the_task_route_or_the_default_queue() -> None:
    assert LABELS.queue("shop.invoice", None) == "billing"
    assert LABELS.queue("gone.task", None) == "celery"


def test_every_registered_task_is_a_series_from_the_start() -> None:
    assert LABELS.registered() == [
        ("jobs", "shop.invoice", "billing"),
        ("jobs", "shop.mail", "celery"),
    ]
