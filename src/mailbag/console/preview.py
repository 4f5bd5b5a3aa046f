"""A message as its recipient would see it, with the secret template fields blanked out."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mailbag.compose import compose
from mailbag.domain.message import Message
from mailbag.domain.verification import EmailReference
from mailbag.settings import Settings
from mailbag.templates import Catalog, TemplateError

REDACTED = "[redacted]"
# Not shown: the MIME structure is noise, and Date would be the time of this preview.
_HIDDEN_HEADERS = frozenset({"mime-version", "content-type", "content-transfer-encoding", "date"})


@dataclass(frozen=True)
class Preview:
    headers: list[tuple[str, str]] = field(default_factory=list)
    html: str = ""
    text: str = ""
    error: str | None = None


def secret_fields(message: Message) -> frozenset[str]:
    named = message.metadata.get("secret_fields") if isinstance(message.metadata, dict) else None
    if not isinstance(named, list | tuple):
        return frozenset()
    return frozenset(name for name in named if isinstance(name, str))


def redacted_data(message: Message) -> dict[str, Any]:
    """Template data safe to show: a verification's token and link never reach the console."""
    secret = secret_fields(message)
    return {k: (REDACTED if k in secret else v) for k, v in message.template_data.items()}


def redacted_secrets(message: Message) -> dict[str, str | None]:
    """The fields a verification email renders with, its token blanked out: the preview
    shows the link's shape, never a token that would confirm."""
    reference = EmailReference.from_metadata(message.metadata)
    return reference.secrets(REDACTED) if reference else {}


def preview(message: Message, catalog: Catalog, settings: Settings, now: datetime) -> Preview:
    safe = dataclasses.replace(message, template_data=redacted_data(message))
    try:
        email = compose(
            safe,
            catalog,
            default_from_email=settings.from_email,
            default_from_name=settings.from_name,
            message_id_domain=settings.message_id_host,
            now=now,
            secrets=redacted_secrets,
        )
        headers = [
            (name, str(value))
            for name, value in email.mime.items()
            if name.lower() not in _HIDDEN_HEADERS
        ]
    except (TemplateError, ValueError) as exc:  # ValueError: an address MIME cannot encode
        return Preview(error=f"{type(exc).__name__}: {exc}")
    return Preview(headers=headers, html=email.html, text=email.text)
