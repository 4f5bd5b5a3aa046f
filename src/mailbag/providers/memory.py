"""`capture`: keep each email in memory instead of sending it, for tests (like Django's
locmem backend and `mail.outbox`). Named `capture`, not `memory`: that name is the test
suite's own scripted plug-in (tests/memory_provider.py).

Every email the provider accepts is recorded, as a `SentEmail`, in each active capture
(`capture()`, and `mailbag.testing`'s helpers, which use it); outside of any capture
nothing is kept, so a long-running `MAILBAG_PROVIDER=capture` worker cannot grow
without bound. Every send is accepted unless `respond` says otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from email.message import EmailMessage
from typing import TYPE_CHECKING

from mailbag.compose import OutgoingEmail
from mailbag.domain.content import Address, Attachment
from mailbag.domain.delivery import Accepted, SendOutcome
from mailbag.providers import register
from mailbag.providers.base import Capabilities, SendOneByOne

if TYPE_CHECKING:
    import uuid

    from mailbag.settings import Settings

# What the provider answers for one email; None: accept it.
Respond = Callable[[OutgoingEmail], SendOutcome | None]


@dataclass(frozen=True)
class SentEmail:
    """One email as it would have left: the composed fields, and the MIME (`raw`, `mime`).
    Addresses are plain strings; `email.recipients` and `email.reply_to` have the names."""

    email: OutgoingEmail

    def __repr__(self) -> str:
        return f"SentEmail(to={self.to!r}, subject={self.subject!r})"

    @property
    def message_id(self) -> uuid.UUID:
        return self.email.message_id

    @property
    def tenant_id(self) -> str:
        return self.email.tenant_id

    @property
    def from_email(self) -> str:
        return self.email.from_email

    @property
    def to(self) -> list[str]:
        return _addresses(self.email.recipients.to)

    @property
    def cc(self) -> list[str]:
        return _addresses(self.email.recipients.cc)

    @property
    def bcc(self) -> list[str]:
        return _addresses(self.email.recipients.bcc)

    @property
    def recipients(self) -> list[str]:
        """Everyone it is delivered to (To, Cc and Bcc), each once."""
        return self.email.envelope_recipients

    @property
    def reply_to(self) -> list[str]:
        return _addresses(self.email.reply_to)

    @property
    def subject(self) -> str:
        return self.email.subject

    @property
    def text(self) -> str:
        return self.email.text

    @property
    def html(self) -> str:
        return self.email.html

    @property
    def attachments(self) -> list[Attachment]:
        return list(self.email.attachments)

    @property
    def headers(self) -> dict[str, str]:
        """The custom headers the message was given (the MIME has all of them)."""
        return dict(self.email.headers)

    @property
    def tags(self) -> list[str]:
        return list(self.email.tags)

    @property
    def raw(self) -> bytes:
        """The complete message as it would go over SMTP (built on first use)."""
        return self.email.raw_utf8 if self.email.needs_smtputf8 else self.email.raw

    @property
    def mime(self) -> EmailMessage:
        """`raw` parsed: headers by name, `get_body()`, `iter_attachments()`."""
        return self.email.mime


def _addresses(addresses: Sequence[Address]) -> list[str]:
    return [a.address for a in addresses]


class Outbox(list[SentEmail]):
    """The emails recorded by one capture, oldest first (a list: `len`, index, `clear`)."""

    def to(self, address: str) -> list[SentEmail]:
        """The emails delivered to `address` (To, Cc or Bcc), compared case-insensitively."""
        wanted = address.lower()
        return [sent for sent in self if wanted in (r.lower() for r in sent.recipients)]


_captures: list[Outbox] = []  # a worker in another thread may record into them
_lock = threading.Lock()


@contextmanager
def capture() -> Iterator[Outbox]:
    """Record every email any capture provider in this process is given while inside."""
    outbox = Outbox()
    with _lock:
        _captures.append(outbox)
    try:
        yield outbox
    finally:
        with _lock:
            _captures.remove(outbox)


def _record(sent: SentEmail) -> None:
    with _lock:
        for outbox in _captures:
            outbox.append(sent)


class CaptureProvider(SendOneByOne):
    name = "capture"
    max_batch_size = 1
    idempotency_window: timedelta | None = None
    capabilities = Capabilities(  # it keeps RFC 6532 MIME as ASCII
        utf8_local_part=True, sends_raw_mime=True
    )

    def __init__(self, respond: Respond | None = None) -> None:
        self.respond = respond

    @classmethod
    def from_settings(cls, settings: Settings) -> CaptureProvider:
        return cls()

    async def send(self, email: OutgoingEmail) -> SendOutcome:
        outcome = self.respond(email) if self.respond is not None else None
        if outcome is not None and not isinstance(outcome, Accepted):
            return outcome  # refused: nothing would have left
        _record(SentEmail(email))
        return outcome or Accepted(f"capture-{email.message_id}-{email.attempt}")


register("capture")(CaptureProvider.from_settings)
