"""What the API answers, as typed, frozen models; and the parts of a request that are
more than a string (an address with a name, an attachment's bytes).

The client's own copy of the wire format, not the server's schemas (api/schemas.py), so
that importing the client does not import FastAPI or SQLAlchemy. Fields the server adds
later are ignored, and statuses are plain strings (typed with the names known today), so an
older client keeps reading a newer server. A test holds these to the server's schemas.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mailbag.client.errors import FieldError, field_errors

MessageStatus = Literal[
    "pending",
    "processing",
    "retrying",
    "sent",
    "failed",
    "dead",
    "unknown",
    "cancelled",
    "expired",
]
VerificationState = Literal["created", "send_pending", "sent", "send_failed", "verified", "expired"]
Priority = Literal["high", "normal", "low"]


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class Address(_Answer):
    """An email address with an optional display name; given to `send` as well as read."""

    address: str
    name: str | None = None

    def __init__(self, address: str, name: str | None = None, **extra: Any) -> None:
        super().__init__(address=address, name=name, **extra)


class Recipients(_Answer):
    to: list[Address]
    cc: list[Address] = Field(default_factory=list)
    bcc: list[Address] = Field(default_factory=list)


class AttachmentInfo(_Answer):
    """A stored attachment: its bytes are kept by the server, described here."""

    filename: str
    content_type: str
    size: int
    sha256: str
    content_id: str | None = None


class Event(_Answer):
    """One change of a message's status."""

    from_status: str | None = Field(None, alias="from")
    to_status: str = Field(alias="to")
    at: datetime
    actor: str
    attempt: int
    provider_message_id: str | None = None
    detail: str | None = None


class Message(_Answer):
    """A message in the outbox. `replayed` is True when the server answered this call
    from its idempotency record: the message was created by an earlier attempt."""

    id: str
    status: MessageStatus
    to: str
    to_name: str | None = None
    recipients: Recipients
    reply_to: list[Address] = Field(default_factory=list)
    from_address: str | None = Field(None, alias="from")
    from_name: str | None = None
    template: str | None = None
    template_version: int | None = None  # the tenant's version it renders with (None: a file's)
    template_locale: str | None = None  # that version's locale
    locale: str | None = None  # the locale it asked for
    ready_made: bool = False
    has_html: bool = False
    has_text: bool = False
    subject: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    attachments: list[AttachmentInfo] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    priority: Priority = "normal"
    bulk: bool = False  # bulk mail: claimed after transactional mail, with List-Unsubscribe
    expires_at: datetime | None = None
    unsubscribe_url: str | None = None
    unsubscribe_mailto: str | None = None
    suppressed: list[str] = Field(default_factory=list)
    attempt_count: int
    max_attempts: int
    next_attempt_at: datetime
    created_at: datetime
    updated_at: datetime
    sent_at: datetime | None = None
    provider: str | None = None
    provider_message_id: str | None = None
    last_error: str | None = None
    events: list[Event] | None = None
    replayed: bool = False


class MessagePage(_Answer):
    """Newest first; `next_cursor` (None on the last page) asks for the next page."""

    items: list[Message]
    next_cursor: str | None = None


class Verification(_Answer):
    """An email verification. `replayed` as for Message."""

    id: str
    email: str
    state: VerificationState
    expires_at: datetime
    created_at: datetime
    updated_at: datetime
    sent_at: datetime | None = None
    verified_at: datetime | None = None
    send_count: int
    message_id: str | None = None
    locale: str | None = None
    replayed: bool = False


class Problem(_Answer):
    """An RFC 9457 problem: why one item of a batch was not written (what a single send
    of it would have raised). `errors` as an APIError has them (`FieldError`s); other
    extension members are kept."""

    model_config = ConfigDict(frozen=True, extra="allow")

    type: str
    title: str
    status: int
    detail: str | None = None
    errors: list[FieldError] = []

    @field_validator("errors", mode="before")
    @classmethod
    def _one_shape(cls, value: object) -> list[FieldError]:
        return field_errors(value)


class BatchItemResult(_Answer):
    index: int
    result: Literal["created", "existing", "invalid"]
    message: Message | None = None
    error: Problem | None = None


class BatchResult(_Answer):
    """One result per item, in the order sent; `replayed` as for Message."""

    created: int
    existing: int
    invalid: int
    results: list[BatchItemResult]
    replayed: bool = False


@dataclass(frozen=True)
class Attachment:
    """A file to send: its bytes, not base64 (the client encodes them). A content_id makes
    it an inline part, shown by the HTML with `cid:<content_id>`; the content type is
    guessed by the server from the filename when left out."""

    filename: str
    content: bytes
    content_type: str | None = None
    content_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        given = {"content_type": self.content_type, "content_id": self.content_id}
        return {
            "filename": self.filename,
            "content": base64.b64encode(self.content).decode("ascii"),
            **{k: v for k, v in given.items() if v is not None},
        }
