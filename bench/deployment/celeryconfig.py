"""The bench's deployment settings for jobsapp: Celery's task events, as each run takes them.

jobsapp reads a deployment's ``celeryconfig`` from the working directory over the one it
ships (``jobsapp.celery_app.celery_settings``); the bench runs jobsapp's producers and
workers from this folder, so both sides of a comparison take their events from the same
variables as ``bench/bare_app.py`` ("1": on). Every other setting is jobsapp's as shipped.
"""

from os import environ as _environ

worker_send_task_events = _environ.get("BENCH_WORKER_EVENTS") == "1"
task_send_sent_event = _environ.get("BENCH_SENT_EVENTS") == "1"
