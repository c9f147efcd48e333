"""The team's web views, in Django's shape: a function of the request that enqueues and
answers. In a Django project the answer is ``JsonResponse(body, status=status)``; here it
is the pair, so the example needs no Django (its tests pass a request-like object)."""

from __future__ import annotations

from typing import Any

from billing.tasks import invoice, remind

DAY = 24 * 3600


def request_invoice(request: Any) -> tuple[int, dict[str, str]]:
    """POST ``account``: the invoice now, a reminder a day later; 202 with the job's id."""
    if request.method != "POST":
        return 405, {"error": "POST only"}
    account = request.POST.get("account", "").strip()
    if not account:
        return 400, {"error": "account is required"}
    job = invoice.delay(account)
    remind.apply_async((account,), countdown=DAY)
    return 202, {"job_id": str(job.id)}
