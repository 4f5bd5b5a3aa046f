"""`file`: write each email as an .eml file a person can open (the `serve` default).

Files are named `<message id>.eml` (ids are time-ordered, so the folder sorts oldest
first) and written atomically (temp file, then
rename), so a mail client or a test never sees half an email. Sending the same message
again overwrites its file: the Message-ID is the same, so it is the same email.

Bcc recipients are in no header, so an email that has them also gets
`<message id>.envelope.json` beside its .eml, written first: the envelope sender and every
envelope recipient (`rcpt_to`), the Bcc ones also listed alone (`bcc`).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from mailbag.compose import OutgoingEmail
from mailbag.domain.delivery import Accepted, Deferred, Rejected, SendOutcome
from mailbag.providers import register
from mailbag.providers.base import Capabilities, SendOneByOne

if TYPE_CHECKING:
    from mailbag.settings import Settings


class FileProvider(SendOneByOne):
    name = "file"
    max_batch_size = 1
    idempotency_window: timedelta | None = None
    capabilities = Capabilities(  # an .eml file holds RFC 6532 headers
        utf8_local_part=True, sends_raw_mime=True
    )

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @classmethod
    def from_settings(cls, settings: Settings) -> FileProvider:
        return cls(settings.file_dir)

    def path_for(self, email: OutgoingEmail) -> Path:
        return self.folder / f"{email.message_id}.eml"

    def envelope_path_for(self, email: OutgoingEmail) -> Path:
        return self.folder / f"{email.message_id}.envelope.json"

    async def send(self, email: OutgoingEmail) -> SendOutcome:
        try:
            path = await asyncio.to_thread(self._write, email)
        except OSError as exc:  # a full disk or a missing permission: nothing was written
            return Deferred(f"cannot write to {self.folder}: {exc}", provider_fault=True)
        except ValueError as exc:  # text no MIME can carry (a lone surrogate, a bad domain)
            return Rejected(f"cannot build the email: {exc}")
        return Accepted(path.name)

    def _write(self, email: OutgoingEmail) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        # Local line endings: the file is for people and tools, not an SMTP wire.
        raw = email.raw_utf8 if email.needs_smtputf8 else email.raw
        if email.recipients.bcc:
            envelope = {
                "mail_from": email.from_email,
                "rcpt_to": email.envelope_recipients,
                "bcc": [address.address for address in email.recipients.bcc],
            }
            text = json.dumps(envelope, ensure_ascii=False, indent=2) + "\n"
            self._replace(self.envelope_path_for(email), text.encode("utf-8"))
        final = self.path_for(email)
        self._replace(final, raw.replace(b"\r\n", b"\n"))
        return final

    def _replace(self, final: Path, content: bytes) -> None:
        """Write `final` atomically: a temporary file, then a rename."""
        descriptor, temporary = tempfile.mkstemp(dir=self.folder, suffix=".part")
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(content)
            os.replace(temporary, final)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


register("file")(FileProvider.from_settings)
