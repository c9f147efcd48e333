"""A lifecycle task on a per-second beat schedule, counted per job in Redis.

Imported only by the processes of the periodic test in tests/e2e/test_maintenance.py
(through ``JOBSAPP_IMPORTS``): in any other beat its schedule would enqueue a job a second.
"""

from __future__ import annotations

from jobsapp.celery_app import app
from jobsapp.lifecycle import current_run, lifecycle_task
from tests.support.tasks import record

ENTRY = "tests-every-second"


@lifecycle_task(app, name="tests.periodic_tick")
def periodic_tick(label: str) -> None:
    record(f"{label}:{current_run().job_id}")


app.conf.beat_schedule = {
    **app.conf.beat_schedule,
    # Catch-up on: the failover test counts every slot, the ones nobody led through too.
    ENTRY: {
        "task": "tests.periodic_tick",
        "schedule": 1.0,
        "kwargs": {"label": "tick"},
        "options": {"catch_up": True},
    },
}
