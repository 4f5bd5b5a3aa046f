"""`console`: print each email (recipients, subject, text, attachments) to stdout. For
development."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, TextIO

from mailbag.compose import OutgoingEmail
from mailbag.domain.content import Address
from mailbag.domain.delivery import Accepted, SendOutcome
from mailbag.providers import register
from mailbag.providers.base import Capabilities, SendOneByOne

if TYPE_CHECKING:
    from mailbag.settings import Settings


class ConsoleProvider(SendOneByOne):
    name = "console"
    max_batch_size = 1
    idempotency_window: timedelta | None = None
    capabilities = Capabilities(utf8_local_part=True)  # it only prints

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout

    @classmethod
    def from_settings(cls, settings: Settings) -> ConsoleProvider:
        return cls()

    async def send(self, email: OutgoingEmail) -> SendOutcome:
        self.out.write(describe(email))
        self.out.flush()
        return Accepted(f"console-{uuid.uuid4()}")


def _mailboxes(addresses: Iterable[Address]) -> str:
    return ", ".join(f"{a.name} <{a.address}>" if a.name else a.address for a in addresses)


def describe(email: OutgoingEmail) -> str:
    """The email as a person reads it: who gets it (Bcc marked envelope only: it is in no
    header), the subject, the text, and what is attached."""
    sender = _mailboxes([Address(email.from_email, email.from_name)])
    lines = [
        f"----- email {email.message_id} (attempt {email.attempt}) -----",
        f"Message-ID: {email.rfc_message_id}",
        f"From: {sender}",
        f"To: {_mailboxes(email.recipients.to)}",
    ]
    if email.recipients.cc:
        lines.append(f"Cc: {_mailboxes(email.recipients.cc)}")
    if email.recipients.bcc:
        lines.append(f"Bcc (envelope only, in no header): {_mailboxes(email.recipients.bcc)}")
    if email.reply_to:
        lines.append(f"Reply-To: {_mailboxes(email.reply_to)}")
    lines += [f"{name}: {value}" for name, value in email.list_unsubscribe.items()]
    lines += [f"Subject: {email.subject}", "", email.text.rstrip()]
    for attachment in email.attachments:
        where = f"inline, cid:{attachment.content_id}" if attachment.inline else "attachment"
        lines.append(
            f"[{where}] {attachment.filename} ({attachment.content_type}, {attachment.size} bytes)"
        )
    lines.append("-----")
    return "\n".join(lines) + "\n"


register("console")(ConsoleProvider.from_settings)
