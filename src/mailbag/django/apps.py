"""The Django app: INSTALLED_APPS += ["mailbag.django"] makes the management commands
(mailbag_migrate, mailbag_worker, mailbag_stats) available, and checks the settings at
start (checks.py). It has no models: mailbag's tables are mailbag's schema, created by
`manage.py mailbag_migrate`."""

from __future__ import annotations

from django.apps import AppConfig


class MailbagConfig(AppConfig):  # type: ignore[misc]  # Django ships no types
    name = "mailbag.django"
    label = "mailbag"
    verbose_name = "mailbag outbox"

    def ready(self) -> None:
        from django.core import checks

        from mailbag.django.checks import mailbag_settings

        checks.register(mailbag_settings, "mailbag")
