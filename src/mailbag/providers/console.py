"""`console`: print each email (headers and text) to stdout. For development."""

from __future__ import annotations

import sys
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, TextIO

from mailbag.compose import OutgoingEmail
from mailbag.domain.delivery import Accepted, SendOutcome
from mailbag.providers import register
from mailbag.providers.base import SendOneByOne

if TYPE_CHECKING:
    from mailbag.settings import Settings


class ConsoleProvider(SendOneByOne):
    name = "console"
    max_batch_size = 1
    idempotency_window: timedelta | None = None
    supports_utf8_local_part = True  # it only prints

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout

    @classmethod
    def from_settings(cls, settings: Settings) -> ConsoleProvider:
        return cls()

    async def send(self, email: OutgoingEmail) -> SendOutcome:
        sender = f"{email.from_name} <{email.from_email}>" if email.from_name else email.from_email
        recipient = f"{email.to_name} <{email.to_email}>" if email.to_name else email.to_email
        self.out.write(
            f"----- email {email.message_id} (attempt {email.attempt}) -----\n"
            f"Message-ID: {email.rfc_message_id}\nFrom: {sender}\nTo: {recipient}\n"
            f"Subject: {email.subject}\n\n{email.text.rstrip()}\n-----\n"
        )
        self.out.flush()
        return Accepted(f"console-{uuid.uuid4()}")


register("console")(ConsoleProvider.from_settings)
