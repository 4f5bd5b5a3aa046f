"""mailbag's settings in a Django project: the `MAILBAG` dict, and the database URL the
worker and the commands use, derived from Django's DATABASES.

    MAILBAG = {
        "TENANT": "default",          # the tenant Django's emails are enqueued for
        "DATABASE": "default",        # the DATABASES alias the outbox lives in
        "PROVIDER": "smtp", "SMTP_HOST": "smtp.example.com", "FROM_EMAIL": "shop@example.com",
        "SECRET_KEY": os.environ["MAILBAG_SECRET_KEY"],
    }

Every other key is a mailbag setting (docs/settings.md), in any case. The keys given here
win; the rest come from MAILBAG_* environment variables and mailbag.toml, as for the
`mailbag` command. DATABASE_URL is never given: it is the alias's database. FROM_EMAIL
(and FROM_NAME), when neither MAILBAG nor the environment gives it, is Django's
DEFAULT_FROM_EMAIL.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from sqlalchemy.engine import URL

if TYPE_CHECKING:
    from mailbag.settings import Settings

DEFAULT_ALIAS = "default"
DEFAULT_TENANT = "default"
# Keys of MAILBAG that are the Django integration's own, not mailbag settings.
OWN_KEYS = frozenset({"tenant", "database"})
# libpq parameters Django's OPTIONS may carry that the worker's connection needs as well.
_LIBPQ_OPTIONS = frozenset(
    {
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "sslpassword",
        "service",
        "passfile",
        "target_session_attrs",
        "application_name",
        "connect_timeout",
    }
)


def mailbag_setting() -> dict[str, Any]:
    """The MAILBAG dict, its keys in lower case; ImproperlyConfigured for an unknown key
    (mailbag's Settings would silently ignore it)."""
    from mailbag.settings import Settings

    given = getattr(django_settings, "MAILBAG", {})
    if not isinstance(given, dict):
        raise ImproperlyConfigured("settings.MAILBAG must be a dict of mailbag settings")
    lowered = {str(key).lower(): value for key, value in given.items()}
    known = OWN_KEYS | set(Settings.model_fields)
    unknown = sorted(key for key in lowered if key not in known)
    if unknown:
        raise ImproperlyConfigured(
            f"settings.MAILBAG has unknown keys: {', '.join(k.upper() for k in unknown)} "
            "(mailbag settings are listed in its docs/settings.md)"
        )
    if "database_url" in lowered:  # one database for the app, the outbox and the worker
        raise ImproperlyConfigured(
            "settings.MAILBAG must not set DATABASE_URL: mailbag uses the Django database "
            "named by MAILBAG['DATABASE'] (default 'default')"
        )
    return lowered


def database_alias(explicit: str | None = None) -> str:
    alias = explicit or mailbag_setting().get("database") or DEFAULT_ALIAS
    if alias not in connections:
        raise ImproperlyConfigured(f"mailbag: there is no database {alias!r} in DATABASES")
    return str(alias)


def tenant(explicit: str | None = None) -> str:
    return str(explicit or mailbag_setting().get("tenant") or DEFAULT_TENANT)


def database_url(alias: str) -> str:
    """The URL of the database Django's `alias` connects to, for mailbag's own engines (the
    worker, migrations, stats). Read from the live connection's settings, so a test
    database Django's test runner made is the one named."""
    connection = connections[alias]
    return url_of(alias, connection.vendor, connection.settings_dict)


def url_of(alias: str, vendor: str, params: dict[str, Any]) -> str:
    """A mailbag database URL for one of Django's DATABASES entries (`params`)."""
    if vendor == "sqlite":
        name = str(params.get("NAME") or "")
        if not name or name == ":memory:" or "mode=memory" in name:
            raise ImproperlyConfigured(
                f"mailbag: DATABASES[{alias!r}] is an in-memory SQLite database; the worker "
                "runs in another process and needs a database file"
            )
        return f"sqlite:///{Path(name).resolve()}"
    if vendor == "postgresql":
        options = params.get("OPTIONS") or {}
        query = {k: str(v) for k, v in options.items() if k in _LIBPQ_OPTIONS}
        host = str(params.get("HOST") or "") or None
        if host is not None and host.startswith("/"):  # a Unix socket directory
            query["host"], host = host, None
        port = params.get("PORT")
        url = URL.create(
            "postgresql",
            username=params.get("USER") or None,
            password=params.get("PASSWORD") or None,
            host=host,
            port=int(port) if port else None,
            database=params.get("NAME") or None,
            query=query,
        )
        return url.render_as_string(hide_password=False)
    raise ImproperlyConfigured(
        f"mailbag.django supports Django's sqlite3 and postgresql backends; "
        f"DATABASES[{alias!r}] is {vendor}"
    )


def _default_from() -> dict[str, str]:
    """Django's DEFAULT_FROM_EMAIL as mailbag's FROM_EMAIL (and FROM_NAME, if it names one)."""
    from email.utils import parseaddr

    name, address = parseaddr(str(django_settings.DEFAULT_FROM_EMAIL))
    if not address:
        return {}
    return {"from_email": address, **({"from_name": name} if name else {})}


def settings_kwargs(alias: str, **overrides: Any) -> dict[str, Any]:
    """What mailbag's Settings are made of here: MAILBAG (without the integration's own
    keys), the alias's database URL, and `overrides` (None values left out)."""
    given = {k: v for k, v in mailbag_setting().items() if k not in OWN_KEYS}
    if "from_email" not in given and "MAILBAG_FROM_EMAIL" not in os.environ:
        given.update({k: v for k, v in _default_from().items() if k not in given})
    given.update({k: v for k, v in overrides.items() if v is not None})
    given["database_url"] = database_url(alias)
    return given


def mailbag_settings(alias: str, **overrides: Any) -> Settings:
    """mailbag's Settings for this project (see the module docstring). Made once for the
    same MAILBAG, DATABASES and MAILBAG_* environment: Django makes a backend per send_mail,
    and reading settings costs more than an enqueue."""
    given = settings_kwargs(alias, **overrides)
    environment = sorted((k, v) for k, v in os.environ.items() if k.startswith("MAILBAG_"))
    key = repr((sorted(given.items()), environment))
    with _lock:
        made = _made.get(key)
    if made is None:
        made = _settings(given)
        with _lock:
            if len(_made) >= _MADE_MAX:
                _made.clear()
            _made[key] = made
    return made


_made: dict[str, Settings] = {}
_MADE_MAX = 16
_lock = threading.Lock()


def _settings(given: dict[str, Any]) -> Settings:
    from pydantic import ValidationError

    from mailbag.settings import Settings

    try:
        return Settings(**given)
    except ValidationError as exc:
        # Each problem without its input: a wrong value may be a secret.
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']).upper()}: {error['msg']}"
            for error in exc.errors()
        )
        raise ImproperlyConfigured(f"settings.MAILBAG: {problems}") from None
