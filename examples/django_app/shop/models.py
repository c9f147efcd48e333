from django.db import models


class Order(models.Model):
    """The user's own row, committed together with the job that mails its receipt."""

    customer = models.CharField(max_length=200)
    total_cents = models.PositiveIntegerField()
    receipt_sent = models.BooleanField(default=False)
