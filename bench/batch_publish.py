"""``python -m bench.batch_publish [ROUNDS]``: jobs/s of one ``enqueue.transaction()`` of 1,000.

A round is timed from the block's start until its messages are in the broker and their
outbox rows are marked sent (the fast path's publish returned and this process's marker
flushed), no worker running; the queue is then emptied, so rounds do not meet each
other's work. Each round is followed by one of bare Celery on the same broker: a loop of
``apply_async`` for the same count inside one kombu publish batch (one Redis pipeline),
the same task-sent events, no database. Reads the database (migrated), broker and imports
from the usual ``JOBSAPP_*`` variables, as the bench's producers do; prints one JSON line:
the median and every round's jobs/s of both (``bench_lifecycle`` turns it into its batch
lines) and every round's CPU milliseconds in this process: on a shared machine the rate
follows the other processes' load, the CPU much less (docs/performance.md).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

BATCH = 1000


def one_batch() -> float:
    """Seconds for one batch of ``BATCH`` jobs, published and marked sent."""
    from bench.lifecycle_tasks import with_lifecycle
    from jobsapp.celery_app import app
    from jobsapp.lifecycle.producer.enqueue import transaction
    from jobsapp.lifecycle.transport import outbox

    start = time.perf_counter()
    with transaction(app) as batch:
        for _ in range(BATCH):
            with_lifecycle.enqueue_in(batch)
    outbox.MARKER.flush()
    return time.perf_counter() - start


def one_bare() -> float:
    """Seconds for bare Celery to publish ``BATCH`` messages in one pipeline."""
    from bench.bare_app import app, bare

    start = time.perf_counter()
    with app.producer_or_acquire() as producer, producer.batch(max_size=4 * BATCH):
        for _ in range(BATCH):
            bare.apply_async(producer=producer)
    return time.perf_counter() - start


def settle() -> None:
    """The queues emptied, outside the timed part."""
    from bench.bare_app import app as bare_app
    from jobsapp.celery_app import app

    for each in (app, bare_app):
        with each.connection_for_write() as conn:
            channel: Any = conn.default_channel  # kombu types it as StdChannel
            channel.queue_purge(each.conf.task_default_queue)


def main(rounds: int) -> dict[str, list[float]]:
    """Each round's jobs/s and CPU milliseconds, jobsapp's and bare Celery's."""
    one_batch()  # warm: connections, prepared plans, declared queues
    one_bare()
    settle()
    found: dict[str, list[float]] = {"rounds": [], "cpu_ms": [], "bare": [], "bare_cpu_ms": []}
    for _ in range(rounds):
        for timed, rates, cpu_ms in (
            (one_batch, "rounds", "cpu_ms"),
            (one_bare, "bare", "bare_cpu_ms"),
        ):
            cpu = time.process_time()
            found[rates].append(BATCH / timed())
            found[cpu_ms].append((time.process_time() - cpu) * 1000)
            settle()
    return found


if __name__ == "__main__":
    found = main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
    medians = {
        "median": statistics.median(found["rounds"]),
        "bare_median": statistics.median(found["bare"]),
    }
    print(json.dumps({**medians, **found}))
