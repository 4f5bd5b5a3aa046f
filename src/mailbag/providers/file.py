"""`file`: write each email as an .eml file a person can open (the `serve` default).

Files are named `<message id>.eml` (ids are time-ordered, so the folder sorts oldest
first) and written atomically (temp file, then
rename), so a mail client or a test never sees half an email. Sending the same message
again overwrites its file: the Message-ID is the same, so it is the same email.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from mailbag.compose import OutgoingEmail
from mailbag.domain.delivery import Accepted, Deferred, Rejected, SendOutcome
from mailbag.providers import register
from mailbag.providers.base import SendOneByOne

if TYPE_CHECKING:
    from mailbag.settings import Settings


class FileProvider(SendOneByOne):
    name = "file"
    max_batch_size = 1
    idempotency_window: timedelta | None = None
    supports_utf8_local_part = True  # an .eml file can hold RFC 6532 headers

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @classmethod
    def from_settings(cls, settings: Settings) -> FileProvider:
        return cls(settings.file_dir)

    def path_for(self, email: OutgoingEmail) -> Path:
        return self.folder / f"{email.message_id}.eml"

    async def send(self, email: OutgoingEmail) -> SendOutcome:
        try:
            path = await asyncio.to_thread(self._write, email)
        except OSError as exc:  # a full disk or a missing permission: nothing was written
            return Deferred(f"cannot write to {self.folder}: {exc}")
        except ValueError as exc:  # text no MIME can carry (a lone surrogate, a bad domain)
            return Rejected(f"cannot build the email: {exc}")
        return Accepted(path.name)

    def _write(self, email: OutgoingEmail) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.path_for(email)
        descriptor, temporary = tempfile.mkstemp(dir=self.folder, suffix=".part")
        try:
            with os.fdopen(descriptor, "wb") as handle:
                # Local line endings: the file is for people and tools, not an SMTP wire.
                raw = email.raw_utf8 if email.needs_smtputf8 else email.raw
                handle.write(raw.replace(b"\r\n", b"\n"))
            os.replace(temporary, final)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return final


register("file")(FileProvider.from_settings)
