"""SendGrid's Event Webhook: its signature, and its events parsed into `ProviderEvent`s.

Pure: the HTTP route reads the body and the headers; this module checks and parses.

    public_key = load_public_key(settings.sendgrid_webhook_public_key)   # ValueError
    authenticate(public_key, request.headers, body, now)  # Unsigned 401, others 403
    events, problems = parse_sendgrid_events(json.loads(body))

The Signed Event Webhook: SendGrid signs `timestamp + raw body` with ECDSA (P-256,
SHA-256) and sends the base64 DER signature in `X-Twilio-Email-Event-Webhook-Signature`
and the Unix seconds in `X-Twilio-Email-Event-Webhook-Timestamp`; the verification key is
the one SendGrid shows on the webhook's settings (base64 DER; PEM is read too). A timestamp
outside the replay window is refused (`signed_webhooks.REPLAY_WINDOW`).

A body is a JSON list of events, read event by event: an event that cannot be used is
skipped with its reason and the others are kept (SendGrid resends a whole batch on any
answer but a 2xx). Every SendGrid event name mailbag understands is in `SENDGRID_EVENTS`;
any other raises `UnsupportedEvent` for its event. Events are deduplicated by
`sg_event_id` ("unique for every event", SendGrid's troubleshooting guide: duplicates
happen), by their content where an event has none.

Matching: our `custom_args` (`mailbag_message_id`, providers/sendgrid.py) come back at the
top level of every event; `sg_message_id` begins with the `X-Message-Id` the send returned
(`<X-Message-Id>.<SendGrid's relay>`), so its first part is our provider message id.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final

from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

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

PROVIDER: Final = "sendgrid"
SIGNATURE_HEADER: Final = "x-twilio-email-event-webhook-signature"
TIMESTAMP_HEADER: Final = "x-twilio-email-event-webhook-timestamp"
# Our keys in the `custom_args` providers/sendgrid.py sends: SendGrid puts them at the
# top level of every event it posts.
MESSAGE_ID_ARG: Final = "mailbag_message_id"
TENANT_ID_ARG: Final = "mailbag_tenant_id"
PROVIDER_MESSAGE_ID_MAX: Final = 255  # the outbox column it is matched against
EVENT_ID_MAX: Final = 100  # "sg_event_id is a string up to 100 characters"

K = EventKind
# SendGrid event name -> kind. Names from SendGrid's Event Webhook reference (deliverability
# and engagement events); a bounce's kind is decided by its `type` (BOUNCE_TYPES).
SENDGRID_EVENTS: Final[Mapping[str, EventKind]] = MappingProxyType(
    {
        "processed": K.ACCEPTED,  # SendGrid took the request and will try to deliver
        "deferred": K.DEFERRED,  # the receiving server said "later"; SendGrid keeps trying
        "delivered": K.DELIVERED,
        "bounce": K.BOUNCED,
        "dropped": K.REJECTED,  # SendGrid did not send it (a suppressed or invalid address)
        "spamreport": K.COMPLAINED,
        "open": K.OPENED,
        "click": K.CLICKED,
        "unsubscribe": K.UNSUBSCRIBED,
        "group_unsubscribe": K.UNSUBSCRIBED,
    }
)
# A bounce's `type`: "bounce" is the receiving server refusing the address for good (SendGrid
# puts it on its bounce list); "blocked" is a refusal of the sending (an IP's reputation, the
# content), not of the address, so it must not suppress it. An event without a type is of
# the era when every bounce was "bounce"; a type not listed is taken as soft (it suppresses
# nothing that may be a working address).
BOUNCE_TYPES: Final[Mapping[str, BounceType]] = MappingProxyType(
    {"bounce": BounceType.HARD, "blocked": BounceType.SOFT}
)
# What a person reads about the event, first found first.
_DETAIL_FIELDS: Final = ("reason", "response", "status")


def load_public_key(text: str) -> ec.EllipticCurvePublicKey:
    """The verification key as SendGrid shows it (base64 of its DER), or as PEM. Raises
    ValueError when it is neither, or not a P-256 key."""
    stripped = text.strip()
    try:
        if stripped.startswith("-----BEGIN"):
            key = serialization.load_pem_public_key(stripped.encode("ascii"))
        else:
            der = base64.b64decode("".join(stripped.split()), validate=True)
            key = serialization.load_der_public_key(der)
    except (ValueError, TypeError, binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError("it is not a public key (base64 DER, or PEM)") from exc
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError("it is not a P-256 (ECDSA) key")
    return key


def verify_signature(
    public_key: ec.EllipticCurvePublicKey, signature: str, timestamp: str, body: bytes
) -> None:
    """Raise InvalidSignature unless `signature` (base64 DER) is SendGrid's ECDSA SHA-256
    signature of `timestamp` followed by the raw `body`. Any time: see `authenticate`."""
    try:
        der = base64.b64decode(signature.strip(), validate=True)
        public_key.verify(der, timestamp.encode("ascii") + body, ec.ECDSA(hashes.SHA256()))
    except (binascii.Error, ValueError, UnicodeEncodeError, _CryptoInvalidSignature):
        raise InvalidSignature("the SendGrid signature does not match the request") from None


def authenticate(
    public_key: ec.EllipticCurvePublicKey, headers: Mapping[str, str], body: bytes, now: datetime
) -> None:
    """Check one signed request: both headers there (else Unsigned), the signature over
    this body (else InvalidSignature), signed within the replay window (else
    StaleMessage). `headers` as Starlette's or httpx's: case-insensitive."""
    signature, timestamp = headers.get(SIGNATURE_HEADER), headers.get(TIMESTAMP_HEADER)
    if not signature or not timestamp:
        raise Unsigned(f"no {SIGNATURE_HEADER} and {TIMESTAMP_HEADER}: is the webhook signed?")
    verify_signature(public_key, signature, timestamp, body)
    signed_at(timestamp, now)


def parse_sendgrid_events(
    payload: object,
) -> tuple[list[ProviderEvent], list[events.InvalidPayload]]:
    """The usable events in one SendGrid webhook body, and why each other one was skipped.
    Raises InvalidPayload only for a body that is not a list of events."""
    if not isinstance(payload, list):
        raise events.InvalidPayload("a SendGrid Event Webhook body is a JSON list of events")
    return events.parse_each(payload, _parse_event)


def _parse_event(payload: object) -> ProviderEvent:
    if not isinstance(payload, Mapping):
        raise events.InvalidPayload("each SendGrid event is a JSON object")
    name = payload.get("event")
    if not isinstance(name, str) or not name:
        raise events.InvalidPayload("the SendGrid event has no 'event' name")
    if name not in SENDGRID_EVENTS:
        raise events.UnsupportedEvent(PROVIDER, event_fields.clean(name[:50]))
    kind = SENDGRID_EVENTS[name]
    bounce_type = _bounce_type(payload) if kind is K.BOUNCED else None
    provider_message_id = _provider_message_id(payload.get("sg_message_id"))
    recipient = event_recipient(payload.get("email"))
    url = event_fields.text(payload.get("url"), ERROR_MAX)
    event_id = event_fields.identifier(payload.get("sg_event_id"), EVENT_ID_MAX)
    occurred_at = event_time(payload.get("timestamp"), "SendGrid")
    return events.keyed_event(
        PROVIDER,
        name if bounce_type is None else f"{name}/{payload.get('type', 'bounce')}",
        kind,
        bounce_type,
        occurred_at,
        recipient=recipient,
        provider_message_id=provider_message_id,
        message_id=(
            events.message_id_from_value(payload.get(MESSAGE_ID_ARG))
            or events.message_id_from_value(payload.get("smtp-id"))  # our Message-ID, if kept
        ),
        provider_event_id=event_id,
        content=(name, provider_message_id, payload.get("timestamp"), url),
        detail=url if kind is K.CLICKED else _detail(payload),
        raw=event_fields.raw_json(payload),
    )


def _bounce_type(payload: Mapping[str, Any]) -> BounceType:
    given = payload.get("type", "bounce")
    return BOUNCE_TYPES.get(given, BounceType.SOFT) if isinstance(given, str) else BounceType.SOFT


def _provider_message_id(value: object) -> str | None:
    """The X-Message-Id part of `sg_message_id` (the part before its first dot)."""
    found = event_fields.identifier(value, 10 * PROVIDER_MESSAGE_ID_MAX)
    if found is None:
        return None
    first = found.split(".", 1)[0]
    return first if first and len(first) <= PROVIDER_MESSAGE_ID_MAX else None


def _detail(payload: Mapping[str, Any]) -> str | None:
    for field in _DETAIL_FIELDS:
        found = event_fields.text(payload.get(field), ERROR_MAX)
        if found is not None:
            return found
    return None
