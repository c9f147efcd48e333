"""Lifecycle tasks of the team's own: every worker imports this module through
``JOBSAPP_IMPORTS=billing.tasks``; producers import it to call them."""

from __future__ import annotations

from typing import Any

from jobsapp.celery_app import app
from jobsapp.lifecycle import lifecycle_task


@lifecycle_task(app, name="billing.invoice", key="invoice:{account_id}")
def invoice(account_id: str) -> str:
    return f"invoiced {account_id}"


@lifecycle_task(
    app,
    name="billing.charge",
    bind=True,
    autoretry_for=(ConnectionError,),
    max_retries=2,
    default_retry_delay=0,
)
def charge(self: Any, account_id: str) -> str:
    """The payment gateway drops the first call: Celery's autoretry takes it again, as the
    same job (its run counts the attempts)."""
    if self.request.retries == 0:
        raise ConnectionError("payment gateway unreachable")
    return f"charged {account_id}"


@lifecycle_task(app, name="billing.notify")
def notify(said: str) -> str:
    """The last step of a chain: it gets what the step before it returned."""
    return f"sent: {said}"
