"""Turn a stored message into the email a provider sends: render the template, build MIME.

Pure: no I/O. The `Message-ID` is derived from the message id, so it is the same on every
attempt and receivers, providers and reconciliation can all match it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from email.headerregistry import Address
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime
from functools import cached_property
from typing import Any

from mailbag.domain.message import Message
from mailbag.templates import Catalog

MESSAGE_ID_HEADER = "X-Mailbag-Message-ID"


def rfc_message_id(message_id: uuid.UUID, domain: str) -> str:
    return f"<{message_id}@{domain}>"


def message_id_from_rfc(value: str) -> uuid.UUID | None:
    """Our message id back from a Message-ID header we wrote, or None if it is not ours."""
    local = value.strip().strip("<>").split("@", 1)[0]
    try:
        return uuid.UUID(local)
    except ValueError:
        return None


@dataclass(frozen=True)
class OutgoingEmail:
    """Everything a provider may need, as fields (for JSON APIs) and as MIME (for SMTP/raw)."""

    message_id: uuid.UUID
    attempt: int
    tenant_id: str
    from_email: str
    from_name: str | None
    to_email: str
    to_name: str | None
    subject: str
    html: str
    text: str
    rfc_message_id: str
    date: datetime
    headers: Mapping[str, str] = field(default_factory=dict)
    tags: Sequence[str] = ()

    @property
    def idempotency_key(self) -> str:
        """One key per attempt: a retry of the same attempt (after an ambiguous send) reuses
        it, a new attempt or an operator's requeue gets a new one."""
        return f"mailbag-{self.message_id}-{self.attempt}"

    @cached_property
    def mime(self) -> EmailMessage:
        """The complete MIME message; built on first use, as JSON-API providers never need it."""
        mime = EmailMessage(policy=SMTP)
        mime["From"] = _address(self.from_email, self.from_name)
        mime["To"] = _address(self.to_email, self.to_name)
        mime["Subject"] = self.subject
        mime["Date"] = format_datetime(self.date)
        mime["Message-ID"] = self.rfc_message_id
        mime[MESSAGE_ID_HEADER] = str(self.message_id)
        for name, value in self.headers.items():
            mime[name] = value
        mime.set_content(self.text, subtype="plain", cte="quoted-printable")
        mime.add_alternative(self.html, subtype="html", cte="quoted-printable")
        return mime

    @cached_property
    def raw(self) -> bytes:
        return self.mime.as_bytes(policy=SMTP)


def compose(
    message: Message,
    catalog: Catalog,
    *,
    default_from_email: str,
    default_from_name: str | None,
    message_id_domain: str,
    now: datetime,
    secrets: Callable[[Message], Mapping[str, Any]] | None = None,
) -> OutgoingEmail:
    """Render and assemble one email. Raises TemplateError when the template cannot render.

    `secrets` gives the template fields that are never stored (a verification's token and
    link): they join the data only here, for this rendering."""
    data = {**message.template_data, **secrets(message)} if secrets else message.template_data
    rendered = catalog.render(message.template_name, data, message.subject)
    from_email = message.from_address or default_from_email
    from_name = default_from_name if message.from_address is None else None
    return OutgoingEmail(
        message_id=message.id,
        attempt=message.attempt,
        tenant_id=message.tenant_id,
        from_email=from_email,
        from_name=from_name,
        to_email=message.to_address,
        to_name=message.to_name,
        subject=rendered.subject,
        html=rendered.html,
        text=rendered.text,
        rfc_message_id=rfc_message_id(message.id, message_id_domain),
        date=now,
        headers=dict(message.headers),
        tags=list(message.tags),
    )


def _address(email: str, name: str | None) -> Address:
    local, _, domain = email.rpartition("@")
    # Headers carry internationalized domains in their ASCII (IDNA) form.
    return Address(display_name=name or "", username=local, domain=domain.encode("idna").decode())
