"""A producer: ``python -m bench.producer SENDER [N]`` enqueues no-op jobs.

With N it enqueues N jobs and exits; without, it reads one count a line from stdin and
enqueues that many each time, until stdin closes (one process serves a measurement's
phases, so its start-up is paid once). Each system's producer runs in a process of its
own, so that each system's globals (jobsapp's settings and engine, Celery apps,
Procrastinate's pool) meet only the database given in its environment. Per count it
prints one JSON line: the wall clock when sending started, the seconds it took and the
producer's CPU seconds. Stdout holds these lines alone (anything else printed goes to
stderr), so a driver can read them as they come.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from celery import Celery

BATCH = 100


def _repeat(call: Callable[[], object]) -> Callable[[int], None]:
    def send(n: int) -> None:
        for _ in range(n):
            call()

    return send


def _bare() -> Callable[[int], None]:
    from bench.bare_app import bare

    return _repeat(bare.delay)


def _naive() -> Callable[[int], None]:
    from bench import naive
    from bench.bare_app import naive_job

    return _repeat(lambda: naive.enqueue(naive_job.delay))


def _deployment() -> Celery:
    """jobsapp's app with the deployment's modules imported, as a team's web app imports
    the module of the tasks it calls: where the scale bench declares its RabbitMQ quorum
    queue. Without them the producer declares a classic queue, RabbitMQ refuses each
    publish, and every job waits for the relay."""
    from jobsapp.celery_app import app
    from jobsapp.settings import get_settings

    for module in get_settings().imports:
        importlib.import_module(module)
    return app


def _lifecycle() -> Callable[[int], None]:
    from bench.lifecycle_tasks import with_lifecycle

    _deployment()
    return _repeat(with_lifecycle.delay)


def _lifecycle_batch() -> Callable[[int], None]:
    from bench.lifecycle_tasks import with_lifecycle
    from jobsapp.lifecycle.producer.enqueue import transaction

    app = _deployment()

    def send(n: int) -> None:
        for start in range(0, n, BATCH):
            with transaction(app) as batch:
                for _ in range(min(BATCH, n - start)):
                    with_lifecycle.enqueue_in(batch)

    return send


def _procrastinate() -> Callable[[int], None]:
    from bench.peer_procrastinate import app, noop

    def send(n: int) -> None:
        with app.open():
            for _ in range(n):
                noop.defer()

    return send


SENDERS: dict[str, Callable[[], Callable[[int], None]]] = {
    "bare": _bare,
    "naive": _naive,
    "lifecycle": _lifecycle,
    "lifecycle-batch": _lifecycle_batch,
    "procrastinate": _procrastinate,
}


def fast_path_held(producer_log: str) -> None:
    """Raises when a jobsapp producer's log says a publish was refused or left for the
    relay: those jobs waited for the relay's grace, and a rate would be the relay's."""
    refused = [line for line in producer_log.splitlines() if "refused" in line]
    if refused:
        raise RuntimeError(f"{len(refused)} refused publishes, the first: {refused[0]}")


def _results() -> TextIO:
    """The original stdout, for the figures alone; print() and libraries get stderr."""
    results = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return results


def main(sender: str, counts: list[int] | None) -> None:
    results = _results()
    send = SENDERS[sender]()
    for n in counts if counts is not None else (int(line) for line in sys.stdin):
        wall, started, cpu = time.time(), time.perf_counter(), time.process_time()
        send(n)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        results.write(json.dumps({"start": wall, "seconds": seconds, "cpu": cpu}) + "\n")
        results.flush()


if __name__ == "__main__":
    main(sys.argv[1], [int(sys.argv[2])] if len(sys.argv) > 2 else None)
