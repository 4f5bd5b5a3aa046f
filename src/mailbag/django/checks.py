"""System checks (`manage.py check`, and before every command that runs them): settings that
would fail at the first send are reported at start.

- mailbag.E001: settings.MAILBAG or the outbox's database cannot be used (an unknown key, a
  missing alias, an in-memory or unsupported database, an invalid mailbag setting);
- mailbag.E002: PROVIDER names no provider mailbag has (the available ones are listed);
- mailbag.E003: no usable SECRET_KEY where one is needed: on a database server every
  worker and API replica needs the same key (the worker refuses to start without one; on
  SQLite a key file beside the database is made instead), and a given key must be long
  enough;
- mailbag.W001: the outbox's SQLite database begins transactions DEFERRED (Django's
  default): a transaction that reads before it writes can then fail at once with
  "database is locked" when the worker wrote in between. OPTIONS["transaction_mode"] =
  "IMMEDIATE" takes the write lock at BEGIN instead, as mailbag's own connections do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from mailbag.django import conf

if TYPE_CHECKING:
    from mailbag.settings import Settings


def mailbag_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        alias = conf.database_alias()
        settings = conf.mailbag_settings(alias)
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="mailbag.E001")]
    found = [*_provider(settings), *_secret_key(settings)]
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


def _provider(settings: Settings) -> list[checks.CheckMessage]:
    from mailbag import providers

    known = providers.available()
    if settings.provider in known:
        return []
    return [
        checks.Error(
            f"settings.MAILBAG['PROVIDER'] (or MAILBAG_PROVIDER) is {settings.provider!r}, "
            "which is no provider mailbag has: the worker could send nothing",
            hint=f"Use one of: {', '.join(known)}.",
            id="mailbag.E002",
        )
    ]


def _secret_key(settings: Settings) -> list[checks.CheckMessage]:
    from mailbag import keys
    from mailbag.database_url import dialect_of

    if settings.secret_key is None and dialect_of(settings.database_url) == "sqlite":
        return []  # keys.load makes a key file beside the database: not a check's business
    try:
        settings.key  # noqa: B018 (loading it is the check, by the worker's own rule)
    except keys.MissingSecretKey as exc:
        return [
            checks.Error(
                f"mailbag: {exc}",
                hint="Set settings.MAILBAG['SECRET_KEY'] (or MAILBAG_SECRET_KEY), the same "
                "value for every process that enqueues or sends.",
                id="mailbag.E003",
            )
        ]
    return []
