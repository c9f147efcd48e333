from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from examples.django_app.shop.models import Order
from examples.django_app.shop.tasks import send_receipt
from jobsapp.contrib.django import enqueue


@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """The order and its receipt job commit together; the message is sent on commit."""
    try:
        total = int(request.POST["total_cents"])
    except (KeyError, ValueError):
        return JsonResponse({"error": "total_cents must be an integer"}, status=400)
    with transaction.atomic():
        order = Order.objects.create(customer=request.POST.get("customer", ""), total_cents=total)
        job = enqueue(send_receipt, kwargs={"order_id": order.pk})
    return JsonResponse({"order": order.pk, "job_id": job.id}, status=201)
