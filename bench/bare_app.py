"""Bare Celery with the broker and worker flags jobsapp uses, and a naive lifecycle on it.

``celery -A bench.bare_app worker``: the worker's task events follow ``BENCH_WORKER_EVENTS``
and the producer's task-sent event ``BENCH_SENT_EVENTS`` ("1": on; Celery ships both off), as
jobsapp's runs of the same comparison take them (``bench/deployment/celeryconfig.py``);
everything else matches celeryconfig: late ack, prefetch 1, reject on worker lost, JSON, no
result backend.
"""

from __future__ import annotations

import os

from celery import Celery

from bench import naive
from bench.tasks import count_done

app = Celery("bench_bare", broker=os.environ.get("JOBSAPP_BROKER_URL"), set_as_current=False)
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    worker_send_task_events=os.environ.get("BENCH_WORKER_EVENTS") == "1",
    task_send_sent_event=os.environ.get("BENCH_SENT_EVENTS") == "1",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench.bare")
def bare() -> None:
    count_done()


@app.task(name="bench.naive")
def naive_job(job_id: str) -> None:
    attempt = naive.claim(job_id)
    if attempt is None:
        return  # a redelivery of a claimed or finished job
    count_done()
    naive.finish(job_id, attempt)
