"""The shop's jobs. A worker finds them through ``JOBSAPP_IMPORTS``:

    DJANGO_SETTINGS_MODULE=examples.django_app.settings \
    JOBSAPP_IMPORTS=examples.django_app.shop.tasks celery -A jobsapp worker
"""

from __future__ import annotations

import os
from typing import Any

import django
from celery.signals import task_postrun, task_prerun
from django.apps import apps
from django.db import close_old_connections

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task

# A worker imports this module before anything has set Django up.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.settings")
if not apps.ready:
    django.setup()


@lifecycle_task(app, name="shop.send_receipt", key="receipt:{order_id}", max_attempts=5)
def send_receipt(order_id: int) -> None:
    from examples.django_app.shop.models import Order

    # Conditional, so a redelivered message never mails twice.
    Order.objects.filter(pk=order_id, receipt_sent=False).update(receipt_sent=True)


@task_prerun.connect
@task_postrun.connect
def _fresh_django_connections(**_kwargs: Any) -> None:
    """A worker has no request cycle: drop connections Django would have closed after one."""
    close_old_connections()
