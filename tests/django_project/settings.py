"""Settings of the test Django project. The databases come from the environment:

- MAILBAG_TEST_DJANGO_SQLITE: the SQLite file of the "default" alias (required);
- MAILBAG_TEST_DJANGO_POSTGRES: a PostgreSQL URL for the "pg" alias (optional).

The worker (`manage.py mailbag_worker`) takes the rest of its settings from MAILBAG below
and from MAILBAG_* variables (the tests give MAILBAG_SMTP_PORT, the test server's port).
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy.engine import make_url

SECRET_KEY = "django-insecure-mailbag-tests-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS: list[str] = []
INSTALLED_APPS = ["mailbag.django", "django_project.shop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING_CONFIG = None  # leave the test process's logging alone

DATABASES: dict[str, dict[str, Any]] = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["MAILBAG_TEST_DJANGO_SQLITE"],
        # What mailbag's docs/django.md recommends for SQLite: the write lock taken at BEGIN, so a
        # transaction that reads and then writes never fails beside a running worker.
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
    }
}
if postgres := os.environ.get("MAILBAG_TEST_DJANGO_POSTGRES"):
    url = make_url(postgres)
    DATABASES["pg"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": url.database,
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.host or "",
        "PORT": str(url.port or ""),
    }

EMAIL_BACKEND = "mailbag.django.EmailBackend"
DEFAULT_FROM_EMAIL = "Shop <shop@example.com>"
MAILBAG = {
    "TENANT": "default",
    "PROVIDER": "smtp",
    "SMTP_HOST": "127.0.0.1",
    "SMTP_TLS": "none",
    "SMTP_TIMEOUT": 5.0,
    "ALLOW_TEST_DOMAINS": True,
    "SECRET_KEY": "mailbag-tests-secret-key-0123456789abcdef",
    "POLL_INTERVAL": 0.05,
    "LOG_LEVEL": "WARNING",
}
