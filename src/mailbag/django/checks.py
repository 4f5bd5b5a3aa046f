"""System checks (`manage.py check`, and before every command that runs them): settings that
would fail at the first send are reported at start.

- mailbag.E001: settings.MAILBAG or the outbox's database cannot be used (an unknown key, a
  missing alias, an in-memory or unsupported database, an invalid mailbag setting);
- mailbag.W001: the outbox's SQLite database begins transactions DEFERRED (Django's
  default): a transaction that reads before it writes can then fail at once with
  "database is locked" when the worker wrote in between. OPTIONS["transaction_mode"] =
  "IMMEDIATE" takes the write lock at BEGIN instead, as mailbag's own connections do.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from mailbag.django import conf


def mailbag_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        alias = conf.database_alias()
        conf.mailbag_settings(alias)
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="mailbag.E001")]
    found: list[checks.CheckMessage] = []
    if connections[alias].vendor == "sqlite":
        mode = (connections[alias].settings_dict.get("OPTIONS") or {}).get("transaction_mode")
        if str(mode or "").upper() != "IMMEDIATE":
            found.append(
                checks.Warning(
                    f"DATABASES[{alias!r}] (SQLite) begins transactions DEFERRED: one that "
                    "reads before it writes may fail with 'database is locked' beside the "
                    "mailbag worker",
                    hint='Set DATABASES[...]["OPTIONS"]["transaction_mode"] = "IMMEDIATE".',
                    id="mailbag.W001",
                )
            )
    return found
