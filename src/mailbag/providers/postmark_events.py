"""Postmark webhooks, parsed into `ProviderEvent`s. Pure: the HTTP route authenticates the
call (Postmark does not sign: HTTP Basic in the webhook URL, or a custom header) and hands
the JSON here.

Postmark POSTs one record a request; its `RecordType` says what it is (postmarkapp.com/
developer/webhooks): Delivery, Bounce, SpamComplaint, Open, Click, SubscriptionChange. A
Bounce's `Type` says which kind (`BOUNCE_TYPES`). A record mailbag does not record (an
auto-reply, a resubscription) parses to no event; a RecordType or bounce Type in no table
raises `UnsupportedEvent`, so a new one is noticed.

Our message id comes from the record's `Metadata.mailbag_message_id` (the postmark
provider sends it); Postmark's `MessageID` is Postmark's own UUID, matched against the id
its send answered, never read as ours. Postmark has no event id but for bounces (`ID`), so
the dedup key hashes what tells one record from another: its RecordType, MessageID, time,
bounce ID and Type, recipient and clicked link.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

from mailbag.domain import events
from mailbag.domain.message import ADDRESS_MAX, ERROR_MAX
from mailbag.providers import event_fields

PROVIDER: Final = "postmark"
PROVIDER_MESSAGE_ID_MAX: Final = 255  # the outbox column it is matched against
METADATA_KEY: Final = "mailbag_message_id"  # as providers.postmark sends it

K = events.EventKind
B = events.BounceType
Mapped = tuple[K, B | None] | None  # None: a record mailbag does not keep

# RecordType -> (kind, bounce type), and where its time and recipient are.
RECORD_TYPES: Final[Mapping[str, tuple[Mapped, str, str]]] = MappingProxyType(
    {
        "Delivery": ((K.DELIVERED, None), "DeliveredAt", "Recipient"),
        "Bounce": ((K.BOUNCED, B.SOFT), "BouncedAt", "Email"),  # its Type decides
        "SpamComplaint": ((K.COMPLAINED, None), "BouncedAt", "Email"),
        "Open": ((K.OPENED, None), "ReceivedAt", "Recipient"),
        "Click": ((K.CLICKED, None), "ReceivedAt", "Recipient"),
        # SuppressSending true for a manual suppression: the recipient unsubscribed. For a
        # hard bounce or complaint the Bounce or SpamComplaint record said it already;
        # SuppressSending false (reactivated) is nothing mailbag records.
        "SubscriptionChange": ((K.UNSUBSCRIBED, None), "ChangedAt", "Recipient"),
    }
)

# A Bounce record's Type (postmarkapp.com/developer/api/bounce-api#bounce-types) -> kind.
# fmt: off
BOUNCE_TYPES: Final[Mapping[str, Mapped]] = MappingProxyType({
    "HardBounce": (K.BOUNCED, B.HARD),  # the address does not exist
    "SoftBounce": (K.BOUNCED, B.SOFT),  # undeliverable for now
    "Transient": (K.DEFERRED, None),  # delayed: Postmark keeps trying
    "DnsError": (K.BOUNCED, B.SOFT),  # a temporary DNS error
    "Unknown": (K.BOUNCED, B.SOFT),  # undetermined: not a reason to suppress
    "VirusNotification": (K.BOUNCED, B.SOFT),  # refused for its content
    "Blocked": (K.BOUNCED, B.SOFT),  # the receiver blocked the sender, not the address
    "DMARCPolicy": (K.BOUNCED, B.SOFT),  # refused for the sender's DMARC policy
    "SpamNotification": (K.COMPLAINED, None),
    "SpamComplaint": (K.COMPLAINED, None),
    "Unsubscribe": (K.UNSUBSCRIBED, None),
    # Postmark refused or failed to send it: it never went out.
    "BadEmailAddress": (K.REJECTED, None),
    "ManuallyDeactivated": (K.REJECTED, None),
    "Unconfirmed": (K.REJECTED, None),
    "SMTPApiError": (K.REJECTED, None),
    "TemplateRenderingFailed": (K.REJECTED, None),
    # Replies and notices that are no verdict on the send.
    "AutoResponder": None,
    "AddressChange": None,
    "ChallengeVerification": None,
    "Subscribe": None,
    "OpenRelayTest": None,
    "InboundError": None,
})
# fmt: on


def parse_postmark_webhook(payload: object) -> list[events.ProviderEvent]:
    """The event in one Postmark webhook body: one, or none for a record mailbag does not
    keep. Raises InvalidPayload for a body Postmark would not send, and UnsupportedEvent
    for a RecordType or bounce Type in no table."""
    if not isinstance(payload, Mapping):
        raise events.InvalidPayload("a Postmark webhook body is one JSON object")
    record_type = payload.get("RecordType")
    if not isinstance(record_type, str) or not record_type:
        if "FromFull" in payload:
            raise events.InvalidPayload("this is a Postmark inbound body, not a delivery event")
        raise events.InvalidPayload("the Postmark record has no RecordType")
    if record_type not in RECORD_TYPES:
        raise events.UnsupportedEvent(PROVIDER, event_fields.clean(record_type[:50]))
    mapped, time_field, recipient_field = RECORD_TYPES[record_type]
    name = record_type
    if record_type == "Bounce":
        bounce = payload.get("Type")
        if not isinstance(bounce, str) or bounce not in BOUNCE_TYPES:
            raise events.UnsupportedEvent(PROVIDER, event_fields.clean(f"Bounce/{bounce}"[:50]))
        mapped, name = BOUNCE_TYPES[bounce], f"Bounce/{bounce}"
    elif record_type == "SubscriptionChange" and not (
        payload.get("SuppressSending") is True
        and payload.get("SuppressionReason") == "ManualSuppression"
    ):
        mapped = None
    if mapped is None:
        return []
    kind, bounce_type = mapped
    return [_event(payload, name, kind, bounce_type, time_field, recipient_field)]


def _event(
    payload: Mapping[str, Any],
    name: str,
    kind: events.EventKind,
    bounce_type: events.BounceType | None,
    time_field: str,
    recipient_field: str,
) -> events.ProviderEvent:
    occurred_at = _time(payload.get(time_field), time_field)
    provider_message_id = event_fields.identifier(payload.get("MessageID"), PROVIDER_MESSAGE_ID_MAX)
    recipient = _recipient(payload.get(recipient_field))
    link = event_fields.text(payload.get("OriginalLink"), ERROR_MAX)
    detail = link if kind is K.CLICKED else _detail(payload)
    return events.keyed_event(
        PROVIDER,
        name,
        kind,
        bounce_type,
        occurred_at,
        recipient=recipient,
        provider_message_id=provider_message_id,
        message_id=_our_message_id(payload.get("Metadata")),
        content=(name, provider_message_id, payload.get(time_field), payload.get("ID"), link),
        detail=detail,
        raw=event_fields.raw_json(payload),
    )


def _time(value: object, field: str) -> datetime:
    """An ISO 8601 time with its offset (Postmark writes `...T16:33:54.9070259Z` or
    `-04:00`: seven fractional digits, which Python reads up to six of)."""
    if not isinstance(value, str) or not value.strip():
        raise events.InvalidPayload(f"the Postmark record has no {field}")
    text = value.strip().replace("Z", "+00:00").replace("z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:  # cut the fraction to microseconds, keep the offset
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[: min(digits, 6)]}{rest[digits:]}"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as error:
        raise events.InvalidPayload(f"Postmark {field} is not an ISO 8601 time") from error
    if moment.tzinfo is None:  # no offset: guessing the zone would misorder events
        raise events.InvalidPayload(f"Postmark {field} has no time zone")
    try:
        return event_fields.storable_time(moment.astimezone(UTC))
    except (OverflowError, ValueError) as error:
        raise events.InvalidPayload(f"Postmark {field} is not a usable time") from error


def _our_message_id(metadata: object) -> uuid.UUID | None:
    value = metadata.get(METADATA_KEY) if isinstance(metadata, Mapping) else None
    if not isinstance(value, str):
        return None
    try:
        return uuid.UUID(value.strip())
    except ValueError:
        return None


def _detail(payload: Mapping[str, Any]) -> str | None:
    """What a person reads: a bounce's Description and Details, a delivery's Details."""
    parts = [event_fields.text(payload.get(f), ERROR_MAX) for f in ("Description", "Details")]
    text = " ".join(part for part in parts if part)
    return text[:ERROR_MAX] or None


def _recipient(value: object) -> str | None:
    address = events.normalize_recipient(event_fields.identifier(value, ADDRESS_MAX))
    return address if address is not None and len(address) <= ADDRESS_MAX else None
