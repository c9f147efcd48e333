"""Imported by a worker (``JOBSAPP_IMPORTS``) whose attachment jobs nobody should run.

The backfill tests watch the reprocess job, not the 2,000 renders it enqueues: those are
routed to a queue no worker of the test consumes.
"""

from jobsapp.attachments.tasks import TASK_NAME
from jobsapp.celery_app import app

PARKED_QUEUE = "parked-attachment-jobs"

app.conf.task_routes = {TASK_NAME: {"queue": PARKED_QUEUE}}
