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


@lifecycle_task(
    app,
    name="billing.settle",
    bind=True,
    autoretry_for=(TimeoutError,),
    max_retries=3,
    default_retry_delay=300,
)
def settle(self: Any, account_id: str) -> str:
    """The bank answers the first call with a timeout: Celery's autoretry tries again in
    five minutes (``default_retry_delay``), which a test reaches by moving the kit's clock."""
    if self.request.retries == 0:
        raise TimeoutError("the bank did not answer")
    return f"settled {account_id}"


@lifecycle_task(app, name="billing.remind")
def remind(account_id: str) -> str:
    """A reminder the invoice view schedules a day ahead."""
    return f"reminded {account_id}"


@lifecycle_task(app, name="billing.export", key="export:{account_id}", limit=2)
def export(account_id: str, month: str) -> str:
    """At most two exports of one account run at once (``limit=2``): a third waits in the
    journal for a slot, holding no worker (docs/flow-control.md)."""
    return f"exported {account_id} {month}"
