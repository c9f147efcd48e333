"""What ``priority`` means: exactly what it means to a plain Celery app on the same broker.

On Redis kombu keeps one list per priority step and reads them smallest first: 0 is the
most urgent, and a message without a priority is at 0. On RabbitMQ (a queue declared with
``x-max-priority``) a larger number is served first, and a message without one is at 0,
the least urgent. The relay publishes its due rows, and reckons which messages a queue may
still hold, in the order the broker serves them, so the two never disagree
(docs/flow-control.md, "Priorities").
"""

from __future__ import annotations

from celery import Celery


def lowest_first(app: Celery) -> bool:
    """Whether ``app``'s broker serves priority 0 first (Redis) rather than last."""
    # No connection is made: kombu only resolves the transport class of the URL.
    with app.connection_for_write() as conn:
        return bool(conn.transport.driver_type == "redis")


def serving_rank(priority: int | None, *, lowest_first: bool) -> int:
    """A sort key over priorities (None: none given, 0): the broker serves smaller first."""
    level = priority or 0
    return level if lowest_first else -level
