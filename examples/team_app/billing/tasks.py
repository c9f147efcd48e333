"""Lifecycle tasks of the team's own: every worker imports this module through
``JOBSAPP_IMPORTS=billing.tasks``; producers import it to call them."""

from __future__ import annotations

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task


@lifecycle_task(app, name="billing.invoice", key="invoice:{account_id}")
def invoice(account_id: str) -> str:
    return f"invoiced {account_id}"
