"""``python -m bench.batch_publish [ROUNDS]``: jobs/s of one ``enqueue.transaction()`` of 1,000.

The batch is timed from the block's start until its messages are in the broker (the
fast path's publish returned), no worker running; its publish marks are then written
(untimed) and the queue emptied, so rounds do not meet each other's work. Reads the
database (migrated), broker and imports from the usual ``JOBSAPP_*`` variables, as the
bench's producers do; prints one JSON line, the median and every round's jobs/s
(``bench_lifecycle`` turns it into its batch line) and every round's CPU milliseconds in
this process: on a shared machine the rate follows the other processes' load, the CPU much
less (docs/performance.md).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

BATCH = 1000


def one_batch() -> float:
    """Seconds for one batch of ``BATCH`` jobs, published included."""
    from bench.lifecycle_tasks import with_lifecycle
    from jobsapp.celery_app import app
    from jobsapp.lifecycle.producer.enqueue import transaction

    start = time.perf_counter()
    with transaction(app) as batch:
        for _ in range(BATCH):
            with_lifecycle.enqueue_in(batch)
    return time.perf_counter() - start


def settle() -> None:
    """Marks written and the queue emptied, outside the timed part."""
    from jobsapp.celery_app import app
    from jobsapp.lifecycle.transport import outbox

    outbox.MARKER.flush()
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(app.conf.task_default_queue)


def main(rounds: int) -> tuple[list[float], list[float]]:
    """Each round's jobs/s and CPU milliseconds."""
    one_batch()  # warm: connections, prepared plans, declared queues
    settle()
    rates, cpu_ms = [], []
    for _ in range(rounds):
        cpu = time.process_time()
        rates.append(BATCH / one_batch())
        cpu_ms.append((time.process_time() - cpu) * 1000)
        settle()
    return rates, cpu_ms


if __name__ == "__main__":
    found, cpu_ms = main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
    print(json.dumps({"median": statistics.median(found), "rounds": found, "cpu_ms": cpu_ms}))
