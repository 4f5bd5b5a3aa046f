"""Mailgun's webhooks: their signature, and their event parsed into a `ProviderEvent`.

Pure: the HTTP route reads the JSON body; this module checks and parses it.

    token = authenticate(signing_key, body, now)   # Unsigned 401, others 403
    event = parse_mailgun_event(body, token)

Mailgun POSTs one event per request, as JSON: `{"signature": {timestamp, token, signature},
"event-data": {...}}`, where `signature` is the hex HMAC-SHA256 of `timestamp + token`
under the account's HTTP webhook signing key (Mailgun's "Securing Webhooks"). The
signature covers only the timestamp and the token, not the event, so a captured request
could carry another event under the same signature: the token is single-use. It is the
event's dedup key (django-anymail's choice too: `event-data.id` is only "unique within a
day"), so a request with a token already seen is a duplicate and stores nothing, on every
replica, for as long as events are kept; and a timestamp outside the replay window is
refused (`signed_webhooks`). What is left: a token whose event was not stored (refused as
unreadable, or of a type mailbag does not keep) is remembered nowhere, so for the rest of
its 5 minutes it could carry another event. Mailgun's own retries resend the same
request: a duplicate, answered 200.

Every Mailgun event name mailbag understands is in `MAILGUN_EVENTS`; a `failed` event is
a bounce whose kind its `severity` and `reason` decide (`_failure`).
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final

from mailbag.domain import events
from mailbag.domain.events import BounceType, EventKind, ProviderEvent
from mailbag.domain.message import ERROR_MAX
from mailbag.providers import event_fields
from mailbag.providers.signed_webhooks import (
    InvalidSignature,
    Unsigned,
    event_recipient,
    event_time,
    signed_at,
)

PROVIDER: Final = "mailgun"
# Our message id rides as the custom variable `v:mailbag-message-id` (providers/mailgun.py
# sends it); events carry it in `user-variables`.
MESSAGE_ID_VARIABLE: Final = "mailbag-message-id"
PROVIDER_MESSAGE_ID_MAX: Final = 255  # the outbox column it is matched against
TOKEN_MAX: Final = 200  # Mailgun's tokens are 50 characters; anything far longer is not one

K = EventKind
B = BounceType
# Mailgun event name -> (kind, bounce type), from Mailgun's webhook and event types.
MAILGUN_EVENTS: Final[Mapping[str, tuple[EventKind, BounceType | None]]] = MappingProxyType(
    {
        "accepted": (K.ACCEPTED, None),  # Mailgun took the request and queued it
        "rejected": (K.REJECTED, None),  # Mailgun refused the request: nothing was sent
        "delivered": (K.DELIVERED, None),
        "failed": (K.BOUNCED, B.HARD),  # decided by severity and reason: see _failure
        "complained": (K.COMPLAINED, None),
        "opened": (K.OPENED, None),
        "clicked": (K.CLICKED, None),
        "unsubscribed": (K.UNSUBSCRIBED, None),
    }
)
# A permanent failure whose reason says it is no refusal of the address by its server:
# Mailgun did not send to an address on its own suppression lists (it never left), or it
# gave up retrying a temporary failure ("old": the address may well work).
PERMANENT_REASONS: Final[Mapping[str, tuple[EventKind, BounceType | None]]] = MappingProxyType(
    {
        "suppress-bounce": (K.REJECTED, None),
        "suppress-complaint": (K.REJECTED, None),
        "suppress-unsubscribe": (K.REJECTED, None),
        "old": (K.BOUNCED, B.SOFT),
    }
)


def authenticate(signing_key: str, payload: object, now: datetime) -> str:
    """The token of a correctly signed request (its dedup key), else raise Unsigned (no
    signature block), InvalidSignature (it does not match) or StaleMessage (signed outside
    the replay window). Compared in constant time."""
    block = payload.get("signature") if isinstance(payload, Mapping) else None
    if not isinstance(block, Mapping):
        raise Unsigned("no 'signature' in the body: is this a Mailgun webhook (JSON)?")
    timestamp, token, signature = (block.get(k) for k in ("timestamp", "token", "signature"))
    if not all(isinstance(part, str | int) and str(part) for part in (timestamp, token, signature)):
        raise Unsigned("the Mailgun signature lacks its timestamp, token or signature")
    expected = hmac.new(
        signing_key.encode(), f"{timestamp}{token}".encode(), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(str(signature).encode(), expected.encode()):
        raise InvalidSignature("the Mailgun signature does not match")
    signed_at(timestamp, now)
    if len(str(token)) > TOKEN_MAX:
        raise InvalidSignature("the Mailgun token is too long to be one")
    return str(token)


def parse_mailgun_event(payload: object, token: str) -> ProviderEvent:
    """The event of one authenticated Mailgun webhook body. Raises InvalidPayload for a body
    Mailgun would not send, UnsupportedEvent for an event name not in MAILGUN_EVENTS."""
    data = payload.get("event-data") if isinstance(payload, Mapping) else None
    if not isinstance(data, Mapping):
        raise events.InvalidPayload("a Mailgun webhook body has its event under 'event-data'")
    name = data.get("event")
    if not isinstance(name, str) or not name:
        raise events.InvalidPayload("the Mailgun event has no 'event' name")
    if name not in MAILGUN_EVENTS:
        raise events.UnsupportedEvent(PROVIDER, event_fields.clean(name[:50]))
    kind, bounce_type = _failure(data) if name == "failed" else MAILGUN_EVENTS[name]
    provider_id = provider_message_id(data)
    recipient = event_recipient(data.get("recipient"))
    severity = data.get("severity")
    return ProviderEvent(
        provider=PROVIDER,
        kind=kind,
        provider_event=f"{name}/{severity}" if isinstance(severity, str) else name,
        bounce_type=bounce_type,
        occurred_at=event_time(data.get("timestamp"), "Mailgun"),
        provider_message_id=provider_id,
        message_id=our_message_id(data, provider_id),
        recipient=recipient,
        # The single-use token alone: a replay under it is a duplicate whatever it carries.
        dedup_key=events.dedup_key(PROVIDER, provider_event_id=f"token:{token}", recipient=None),
        detail=_detail(data, kind),
        raw=event_fields.raw_json({"event-data": data}),  # the signature is not kept
    )


def _failure(data: Mapping[str, Any]) -> tuple[EventKind, BounceType | None]:
    """A `failed` event: temporary (Mailgun retries: a soft bounce), or permanent (the
    receiving server refused the address: hard, unless its reason says otherwise)."""
    if data.get("severity") == "temporary":
        return K.BOUNCED, B.SOFT
    reason = data.get("reason")
    if isinstance(reason, str) and reason in PERMANENT_REASONS:
        return PERMANENT_REASONS[reason]
    return K.BOUNCED, B.HARD


def provider_message_id(data: Mapping[str, Any]) -> str | None:
    """The Message-ID of an event's (or an Events API record's) message, as the send API
    returned it: in angle brackets (events give it without)."""
    message = data.get("message")
    headers = message.get("headers") if isinstance(message, Mapping) else None
    found = headers.get("message-id") if isinstance(headers, Mapping) else None
    bare = event_fields.identifier(found, PROVIDER_MESSAGE_ID_MAX - 2)
    return f"<{bare.strip('<>')}>" if bare else None


def our_message_id(data: Mapping[str, Any], provider_id: str | None) -> uuid.UUID | None:
    """Which of our messages an event (or record) is of: our variable, else our Message-ID
    (Mailgun keeps the Message-ID of the MIME we send)."""
    variables = data.get("user-variables")
    if isinstance(variables, Mapping):
        found = events.message_id_from_value(variables.get(MESSAGE_ID_VARIABLE))
        if found is not None:
            return found
    return events.message_id_from_value(provider_id)


def _detail(data: Mapping[str, Any], kind: EventKind) -> str | None:
    if kind is K.CLICKED:
        return event_fields.text(data.get("url"), ERROR_MAX)
    status = data.get("delivery-status")
    reject = data.get("reject")
    for source, field in (
        (status, "description"),
        (status, "message"),
        (reject, "reason"),
        (data, "reason"),
    ):
        if isinstance(source, Mapping):
            found = event_fields.text(source.get(field), ERROR_MAX)
            if found is not None:
                return found
    return None
