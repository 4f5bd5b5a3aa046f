"""mailbag in a Django project: an email backend that enqueues on Django's own connection
and transaction, settings from settings.MAILBAG, and management commands.

    INSTALLED_APPS += ["mailbag.django"]        # manage.py mailbag_migrate / _worker / _stats
    EMAIL_BACKEND = "mailbag.django.EmailBackend"
    mailbag.django.enqueue(to=..., template="welcome", data={...})   # mailbag's templates

See backend.py (what is enqueued, and when), outbox.py (`enqueue`), convert.py (how an
EmailMessage maps onto a mailbag message), connection.py (how SQLAlchemy runs on Django's
connection) and conf.py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mailbag.django.backend import EmailBackend
    from mailbag.django.outbox import enqueue

__all__ = ["EmailBackend", "enqueue"]
_EXPORTS = {"EmailBackend": "mailbag.django.backend", "enqueue": "mailbag.django.outbox"}


def __getattr__(name: str) -> Any:
    # Imported on first use: INSTALLED_APPS imports this package before Django is ready.
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mailbag.django' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
