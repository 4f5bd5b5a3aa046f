"""An application's own rows, written in the same transaction as its emails."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    email = models.EmailField()
    reference = models.CharField(max_length=100, unique=True)
