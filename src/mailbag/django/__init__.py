"""mailbag in a Django project: an email backend that enqueues on Django's own connection
and transaction, settings from settings.MAILBAG, and management commands.

    INSTALLED_APPS += ["mailbag.django"]        # manage.py mailbag_migrate / _worker / _stats
    EMAIL_BACKEND = "mailbag.django.EmailBackend"

See backend.py (what is enqueued, and when), convert.py (how an EmailMessage maps onto a
mailbag message), connection.py (how SQLAlchemy runs on Django's connection) and conf.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mailbag.django.backend import EmailBackend

__all__ = ["EmailBackend"]


def __getattr__(name: str) -> Any:
    # Imported on first use: INSTALLED_APPS imports this package before Django is ready.
    if name == "EmailBackend":
        from mailbag.django.backend import EmailBackend

        return EmailBackend
    raise AttributeError(f"module 'mailbag.django' has no attribute {name!r}")
