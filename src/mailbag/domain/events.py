"""What a provider tells us about an email after the send: one vocabulary for every provider.

Each provider module parses its own webhook payloads into `ProviderEvent`s (keeping its
event names in one table); everything downstream (reconciliation of `unknown` sends, the
suppression list, the message history) reads only this module's names. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from email_validator import EmailNotValidError

from mailbag.domain.message import normalize_address

# The providers whose webhook events mailbag reads (a provider is named as it is registered).
EventSource = Literal["brevo", "ses", "sendgrid", "mailgun", "postmark", "resend"]


class EventKind(StrEnum):
    ACCEPTED = "accepted"  # the provider took the request and will try to deliver
    DELIVERED = "delivered"  # the receiving server accepted it
    DEFERRED = "deferred"  # the receiving server said "later"; the provider keeps trying
    BOUNCED = "bounced"  # the receiving server refused it (see BounceType)
    COMPLAINED = "complained"  # the recipient marked it as spam
    REJECTED = "rejected"  # the provider refused or dropped it: it was never sent
    OPENED = "opened"
    CLICKED = "clicked"
    UNSUBSCRIBED = "unsubscribed"


class BounceType(StrEnum):
    HARD = "hard"  # permanent: the address does not work, stop sending to it
    SOFT = "soft"  # temporary or undetermined: the address may work another day


class InvalidPayload(ValueError):
    """A webhook body that is not what the provider documents: the caller answers 400."""


class UnsupportedEvent(InvalidPayload):
    """A well-formed event whose name is in no mapping table (a new provider event type, or
    a webhook configured for events mailbag does not handle). The caller answers 400, or
    200 if it prefers the provider to stop retrying; either way nothing is recorded."""

    def __init__(self, provider: EventSource, event_name: str) -> None:
        self.provider = provider
        self.event_name = event_name
        super().__init__(f"{provider} event {event_name!r} is not one mailbag understands")


# Kinds that mean the provider had the message. REJECTED is the only kind that does not:
# the provider refused or dropped it before any delivery attempt.
_ACCEPTANCE_KINDS = frozenset(EventKind) - {EventKind.REJECTED}


@dataclass(frozen=True)
class ProviderEvent:
    """One provider event about one recipient of one email, normalized."""

    provider: EventSource
    kind: EventKind
    # The provider's own name for the event ("hard_bounce", "Bounce"), for logs and history.
    provider_event: str
    occurred_at: datetime  # aware, UTC
    # Brevo's `message-id` as given (with its angle brackets); SES's `mail.messageId`. The
    # same value the provider's send API returned, so it matches outbox provider_message_id.
    provider_message_id: str | None
    # Our outbox message id, when the payload carries it (header, tag or our Message-ID).
    message_id: uuid.UUID | None
    recipient: str | None  # normalized as the outbox normalizes addresses (domain lowercased)
    # The same string whenever the provider sends this same event again: store it unique.
    dedup_key: str
    detail: str | None  # bounce diagnostic, SMTP response, reject reason, clicked link
    raw: Mapping[str, Any] = field(compare=False, repr=False)
    bounce_type: BounceType | None = None

    def __post_init__(self) -> None:
        if self.occurred_at.utcoffset() != timedelta(0):
            raise ValueError("occurred_at must be an aware UTC datetime")
        if (self.kind is EventKind.BOUNCED) != (self.bounce_type is not None):
            raise ValueError("bounce_type is set exactly when kind is bounced")


def keyed_event(
    provider: EventSource,
    name: str,
    kind: EventKind,
    bounce_type: BounceType | None,
    occurred_at: datetime,
    *,
    recipient: str | None,
    provider_message_id: str | None,
    message_id: uuid.UUID | None,
    detail: str | None,
    raw: Mapping[str, Any],
    provider_event_id: str | None = None,
    content: tuple[object, ...] = (),
) -> ProviderEvent:
    """The event `name` (`kind`, with its bounce type) of `provider` about `recipient`, its
    dedup key made from that same provider and recipient and from `provider_event_id` or
    `content` (see dedup_key), so the key can name no other."""
    return ProviderEvent(
        provider=provider,
        kind=kind,
        provider_event=name,
        bounce_type=bounce_type,
        occurred_at=occurred_at,
        provider_message_id=provider_message_id,
        message_id=message_id,
        recipient=recipient,
        dedup_key=dedup_key(
            provider, provider_event_id=provider_event_id, recipient=recipient, content=content
        ),
        detail=detail,
        raw=raw,
    )


def suppresses(event: ProviderEvent) -> bool:
    """Whether the recipient's address should go on the suppression list: a hard bounce
    (the address does not exist) or a complaint (the person asked not to hear from us)."""
    if event.kind is EventKind.COMPLAINED:
        return True
    return event.kind is EventKind.BOUNCED and event.bounce_type is BounceType.HARD


def proves_acceptance(event: ProviderEvent) -> bool:
    """Whether the event shows the provider had the message: evidence that resolves an
    `unknown` send as sent. False (REJECTED) shows the provider did not send it."""
    return kind_proves_acceptance(event.kind)


def kind_proves_acceptance(kind: EventKind | str) -> bool:
    return EventKind(kind) in _ACCEPTANCE_KINDS


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def message_id_from_value(value: object) -> uuid.UUID | None:
    """Our message id from a header or tag value: a bare UUID (`X-Mailbag-Message-ID`, the
    `mailbag_message_id` tag) or our Message-ID `<uuid@domain>`. Only the canonical
    hyphenated form counts, so someone else's Message-ID of 32 hex digits is not taken for
    one of ours."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.startswith("<") and text.endswith(">"):
        text = text[1:-1]
    local = text.split("@", 1)[0].lower()
    if not _CANONICAL_UUID.fullmatch(local):
        return None
    return uuid.UUID(local)


def normalize_recipient(address: object) -> str | None:
    """The recipient as the outbox stores addresses, so a suppression matches its messages.
    An address the validator refuses is still kept (with its domain lowercased): the
    provider saw it, and dropping the event would hide a bounce."""
    if not isinstance(address, str) or not address.strip():
        return None
    text = address.strip()
    try:
        return normalize_address(text)
    except EmailNotValidError:
        local, at, domain = text.rpartition("@")
        return f"{local}{at}{domain.lower()}" if at else text


def dedup_key(
    provider: EventSource,
    *,
    provider_event_id: str | None = None,
    recipient: str | None,
    content: tuple[object, ...] = (),
) -> str:
    """`provider:<sha256>`: a fixed-length key, the same for a resent event.

    With a provider event id (SES's feedbackId) the key hashes that id and the recipient
    (one feedback can name several recipients). Without one it hashes `content`, the fields
    that tell this event apart from every other (event name, provider message id, event
    time, clicked link ...). Values go through JSON so "a|b","c" and "a","b|c" differ.
    """
    parts: tuple[object, ...]
    if provider_event_id:
        parts = ("id", provider_event_id, recipient)
    else:
        parts = ("content", recipient, *content)
    encoded = json.dumps([provider, *parts], default=str, separators=(",", ":"))
    return f"{provider}:{hashlib.sha256(encoded.encode()).hexdigest()}"


def parse_each(
    items: Iterable[object], parse: Callable[[object], ProviderEvent]
) -> tuple[list[ProviderEvent], list[InvalidPayload]]:
    """Each item of a batched webhook body parsed alone: the usable events, and why each
    other item was skipped (one bad item costs the others nothing)."""
    found: list[ProviderEvent] = []
    problems: list[InvalidPayload] = []
    for item in items:
        try:
            found.append(parse(item))
        except InvalidPayload as problem:
            problems.append(problem)
    return found, problems
