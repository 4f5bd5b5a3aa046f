"""Resend webhooks: their Svix signature checked, their events parsed into `ProviderEvent`s.
Pure: the HTTP route reads the body and the headers and hands them here.

Signature: Resend signs with Svix, which is the Standard Webhooks scheme mailbag signs its
own hooks with (`domain.hooks.signing`): headers `svix-id`, `svix-timestamp` and
`svix-signature` (`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`), the secret
RESEND_WEBHOOK_SECRET `whsec_...`. `verify_resend_signature` hands those headers to
`signing.verify` under the names it reads, so the HMAC, the constant-time comparison, the
several signatures of a key rotation and the timestamp tolerance (replays of an old
capture are refused) are one door for both. No svix headers at all: `Unsigned`.

Events (resend.com/docs/dashboard/webhooks/event-types, the spec's `webhooks:`): one a
request, `{type, created_at, data}`; `RESEND_EVENTS` maps each `email.*` type. One event
names its recipients in `data.to`: one `ProviderEvent` each. Types mailbag does not record
(`email.scheduled`, `email.received`, `contact.*`, `domain.*`) parse to none, and are
answered 200, so Svix stops resending them; an unknown `email.*` type raises
`UnsupportedEvent`, so it is noticed.

Our message id comes from the `mailbag_message_id` tag (`data.tags`) or our
X-Mailbag-Message-ID header (`data.headers`); Resend's `email_id` is Resend's own UUID,
matched against the id its send answered, never read as ours. The dedup key is the Svix
message id (the same on every resend of the event) and the recipient.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

from mailbag.compose import MESSAGE_ID_HEADER
from mailbag.domain import events
from mailbag.domain.hooks import signing
from mailbag.domain.message import ADDRESS_MAX, ERROR_MAX
from mailbag.providers import event_fields

PROVIDER: Final = "resend"
PROVIDER_MESSAGE_ID_MAX: Final = 255  # the outbox column it is matched against
TAG_NAME: Final = "mailbag_message_id"  # as providers.resend sends it
SVIX_HEADERS: Final = {
    "svix-id": "webhook-id",
    "svix-timestamp": "webhook-timestamp",
    "svix-signature": "webhook-signature",
}

K = events.EventKind
B = events.BounceType
# fmt: off
RESEND_EVENTS: Final[Mapping[str, tuple[K, B | None] | None]] = MappingProxyType({
    "email.sent": (K.ACCEPTED, None),  # the API request succeeded: Resend has it
    "email.delivered": (K.DELIVERED, None),
    "email.delivery_delayed": (K.DEFERRED, None),  # a temporary problem; Resend keeps trying
    "email.bounced": (K.BOUNCED, B.SOFT),  # bounce.type decides: see _bounce_type
    "email.complained": (K.COMPLAINED, None),
    "email.opened": (K.OPENED, None),
    "email.clicked": (K.CLICKED, None),
    # Resend did not send it: its own failure (a quota: `failed.reason`), or an address on
    # its suppression list (a bounce or complaint before). Never sent, so REJECTED; the
    # earlier bounce or complaint is what suppressed the address.
    "email.failed": (K.REJECTED, None),
    "email.suppressed": (K.REJECTED, None),
    # Not about a send of ours: answered, not recorded.
    "email.scheduled": None,  # mailbag never schedules at Resend
    "email.received": None,  # inbound mail
})
# fmt: on


class InvalidResendSignature(ValueError):
    """The request does not prove it came from Resend (a wrong or stale signature)."""


class Unsigned(InvalidResendSignature):
    """The request carries no Svix signature at all."""


def verify_resend_signature(
    secret: str, headers: Mapping[str, str], body: bytes, *, now: float
) -> str:
    """Check a Resend webhook's Svix signature; return its svix-id. Raises Unsigned when it
    has no svix headers, InvalidResendSignature when they do not prove the secret's holder
    signed this body within the tolerance (signing.TOLERANCE_SECONDS)."""
    lower = {name.lower(): value for name, value in headers.items()}
    if not any(name in lower for name in SVIX_HEADERS):
        raise Unsigned("no svix-id, svix-timestamp or svix-signature header")
    standard = {ours: lower.get(svix, "") for svix, ours in SVIX_HEADERS.items()}
    try:
        return signing.verify(secret, standard, body, now=now)
    except signing.InvalidSignature as exc:
        raise InvalidResendSignature(str(exc).replace("webhook-", "svix-")) from None


def parse_resend_webhook(payload: object, event_id: str) -> list[events.ProviderEvent]:
    """The events in one Resend webhook body (one per recipient it names; none for a type
    mailbag does not record). `event_id` is its verified svix-id. Raises InvalidPayload
    for a body Resend would not send, UnsupportedEvent for an unknown `email.*` type."""
    if not isinstance(payload, Mapping):
        raise events.InvalidPayload("a Resend webhook body is one JSON object")
    name = payload.get("type")
    if not isinstance(name, str) or not name:
        raise events.InvalidPayload("the Resend event has no type")
    if name not in RESEND_EVENTS:
        if name.startswith(("contact.", "domain.")):
            return []  # audience and domain events: nothing about a send
        raise events.UnsupportedEvent(PROVIDER, event_fields.clean(name[:50]))
    mapped = RESEND_EVENTS[name]
    if mapped is None:
        return []
    data = payload.get("data")
    if not isinstance(data, Mapping):
        raise events.InvalidPayload("the Resend event has no data object")
    kind, bounce_type = mapped
    if kind is K.BOUNCED:
        bounce_type = _bounce_type(data.get("bounce"))
    occurred_at = _time(payload.get("created_at"))
    provider_message_id = event_fields.identifier(data.get("email_id"), PROVIDER_MESSAGE_ID_MAX)
    ours = _our_message_id(data)
    detail = _detail(kind, data)
    recipients = data.get("to")
    named = [r for r in recipients if isinstance(r, str)] if isinstance(recipients, list) else []
    return [
        events.keyed_event(
            PROVIDER,
            name,
            kind,
            bounce_type,
            occurred_at,
            recipient=recipient,
            provider_message_id=provider_message_id,
            message_id=ours,
            provider_event_id=event_id,
            detail=detail,
            raw=event_fields.raw_json(payload),
        )
        for recipient in ([_recipient(r) for r in named] or [None])
    ]


def _bounce_type(bounce: object) -> events.BounceType:
    """Resend's bounce.type: Permanent is hard; Transient and Undetermined are soft."""
    kind = bounce.get("type") if isinstance(bounce, Mapping) else None
    return B.HARD if kind == "Permanent" else B.SOFT


def _time(value: object) -> datetime:
    if not isinstance(value, str) or not value.strip():
        raise events.InvalidPayload("the Resend event has no created_at")
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError as error:
        raise events.InvalidPayload("Resend created_at is not an ISO 8601 time") from error
    if moment.tzinfo is None:
        raise events.InvalidPayload("Resend created_at has no time zone")
    try:
        return event_fields.storable_time(moment.astimezone(UTC))
    except (OverflowError, ValueError) as error:
        raise events.InvalidPayload("Resend created_at is not a usable time") from error


def _our_message_id(data: Mapping[str, Any]) -> uuid.UUID | None:
    tags = data.get("tags")
    if isinstance(tags, Mapping):
        found = events.message_id_from_value(tags.get(TAG_NAME))
        if found is not None:
            return found
    headers = data.get("headers")
    for header in headers if isinstance(headers, list) else []:
        if not isinstance(header, Mapping):
            continue
        name = header.get("name")
        if isinstance(name, str) and name.lower() == MESSAGE_ID_HEADER.lower():
            found = events.message_id_from_value(header.get("value"))
            if found is not None:
                return found
    return None


def _detail(kind: events.EventKind, data: Mapping[str, Any]) -> str | None:
    """The clicked link, the bounce's or suppression's message, or why it failed."""
    field, key = {
        K.CLICKED: ("click", "link"),
        K.BOUNCED: ("bounce", "message"),
        K.REJECTED: ("failed", "reason"),
    }.get(kind, ("", ""))
    part = data.get(field) if field else None
    if kind is K.REJECTED and not isinstance(part, Mapping):
        part, key = data.get("suppressed"), "message"
    return event_fields.text(part.get(key), ERROR_MAX) if isinstance(part, Mapping) else None


def _recipient(value: object) -> str | None:
    """An address of `data.to` (`Name <address>` or bare), as the outbox stores it."""
    text = event_fields.identifier(value, ADDRESS_MAX)
    if text is not None and text.endswith(">") and "<" in text:
        text = text.rpartition("<")[2][:-1]
    address = events.normalize_recipient(text)
    return address if address is not None and len(address) <= ADDRESS_MAX else None
