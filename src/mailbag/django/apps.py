"""The Django app: INSTALLED_APPS += ["mailbag.django"] makes the management commands
(mailbag_migrate, mailbag_worker, mailbag_stats) available. It has no models: mailbag's
tables are mailbag's schema, created by `manage.py mailbag_migrate`."""

from __future__ import annotations

from django.apps import AppConfig


class MailbagConfig(AppConfig):  # type: ignore[misc]  # Django ships no types
    name = "mailbag.django"
    label = "mailbag"
    verbose_name = "mailbag outbox"
