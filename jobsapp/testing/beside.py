"""Beat's relay beside Celery's embedded test worker.

A countdown, an eta or a retry's delay longer than ``JOBSAPP_INLINE_WAIT_MAX`` waits in the
journal, and beat's relay publishes the job's message when it is due (docs/lifecycle.md). A
test session runs Celery's embedded worker (``start_worker(app)``, the ``celery_worker`` and
``celery_session_worker`` fixtures, the kit's ``jobsapp_worker``) and no beat: such a call
never ran and its ``get()`` timed out, where Celery's worker holds the ETA message and runs
it then. While an embedded worker of an app with lifecycle tasks runs, the relay's tick runs
beside it (the plugin connects these receivers to ``celery.contrib.testing.worker``'s
``test_worker_started`` and ``test_worker_stopped``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery

log = logging.getLogger(__name__)

# How late a due job may start after its time: beat's own cadence is two seconds, a test
# waits on each.
EVERY = 1.0

# A tick's longest wait for its own end once its worker stopped.
JOIN_TIMEOUT = 10.0

_TICKING: dict[int, tuple[threading.Event, threading.Thread]] = {}


def worker_started(sender: Celery, worker: Any = None, **_kwargs: Any) -> None:
    from jobsapp.lifecycle.task import LifecycleTask

    if not any(isinstance(task, LifecycleTask) for task in sender.tasks.values()):
        return
    stop = threading.Event()
    ticker = threading.Thread(target=_tick, args=(sender, stop), name="jobsapp-relay", daemon=True)
    _TICKING[id(worker)] = (stop, ticker)
    ticker.start()


def worker_stopped(sender: Celery, worker: Any = None, **_kwargs: Any) -> None:
    del sender
    found = _TICKING.pop(id(worker), None)
    if found is None:
        return
    stop, ticker = found
    stop.set()
    # Ended before the next test's set-up: a tick still publishing would race its reset.
    ticker.join(JOIN_TIMEOUT)


def _tick(app: Celery, stop: threading.Event) -> None:
    from jobsapp.db import get_engine
    from jobsapp.testing.kit import relay_tick

    while not stop.wait(EVERY):
        try:
            relay_tick(app, get_engine())
        except Exception:
            # As beat's pass: the next tick tries again; the test sees the job wait.
            log.exception("the relay's tick beside the test worker failed")
