"""Brevo transactional webhooks, parsed into `ProviderEvent`s. Pure: the HTTP route reads the
body and authenticates the call; this module only reads the JSON it was given.

Brevo POSTs one event per request, or a JSON list of them when the webhook is "batched".
Every Brevo event name mailbag understands is in `BREVO_EVENTS`; any other name raises
`UnsupportedEvent` (the caller answers 400, or 200 to stop Brevo retrying), so a new Brevo
event type is noticed instead of silently dropped.

A batched body is read event by event (`parse_brevo_events`): an event that cannot be used
is skipped with its reason, and the others are kept, so one bad event cannot make Brevo
drop or resend its whole batch. Every field is made storable (`event_fields`).

Brevo has no per-event id (its `id` is the webhook's id, the same on every call), so the
dedup key hashes what tells one event from another: event name, message id, recipient,
Brevo's three timestamps and, for clicks, the link.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

from mailbag.compose import MESSAGE_ID_HEADER
from mailbag.domain import events
from mailbag.domain.message import ADDRESS_MAX, ERROR_MAX
from mailbag.providers import event_fields

PROVIDER_MESSAGE_ID_MAX: Final = 255  # the outbox column it is matched against

PROVIDER: Final = "brevo"

K = events.EventKind
# Brevo event name -> (kind, bounce type). Names from developers.brevo.com/docs/
# transactional-webhooks, plus the spellings Brevo has also been seen to send.
BREVO_EVENTS: Final[Mapping[str, tuple[events.EventKind, events.BounceType | None]]] = (
    MappingProxyType(
        {
            "request": (K.ACCEPTED, None),  # "Sent": Brevo took the request
            "delivered": (K.DELIVERED, None),
            "deferred": (K.DEFERRED, None),
            "soft_bounce": (K.BOUNCED, events.BounceType.SOFT),
            "hard_bounce": (K.BOUNCED, events.BounceType.HARD),
            "blocked": (K.REJECTED, None),  # Brevo refused to send (blocklisted address, ...)
            "invalid_email": (K.REJECTED, None),  # Brevo judged the address invalid, did not send
            "error": (K.REJECTED, None),  # Brevo failed to send it
            "spam": (K.COMPLAINED, None),
            "complaint": (K.COMPLAINED, None),
            "opened": (K.OPENED, None),
            "unique_opened": (K.OPENED, None),
            "proxy_open": (K.OPENED, None),  # opened through a privacy proxy (Apple Mail)
            "unique_proxy_open": (K.OPENED, None),
            "click": (K.CLICKED, None),
            "unsubscribed": (K.UNSUBSCRIBED, None),
            "unsubscribe": (K.UNSUBSCRIBED, None),
        }
    )
)

# `ts_epoch` is documented in milliseconds but shown in seconds in one of Brevo's own
# examples; no event of this era has a seconds value above 1e11 (year 5138).
_MILLISECONDS_ABOVE: Final = 10**11
# `ts_epoch` is the field that is reliably UTC; `ts_event` and `ts` are fallbacks.
_TIMESTAMP_FIELDS: Final = ("ts_epoch", "ts_event", "ts")


def parse_brevo_webhook(
    payload: Mapping[str, Any] | Sequence[Mapping[str, Any]],
) -> list[events.ProviderEvent]:
    """The events in one Brevo webhook body (a JSON object, or a list for batched webhooks).

    Raises InvalidPayload for a body Brevo would not send and UnsupportedEvent for an event
    name missing from BREVO_EVENTS; nothing is returned for the body then.
    """
    found, problems = parse_brevo_events(payload)
    if problems:
        raise problems[0]
    return found


def parse_brevo_events(
    payload: object,
) -> tuple[list[events.ProviderEvent], list[events.InvalidPayload]]:
    """The usable events in one Brevo webhook body, and why each other one was skipped.

    Raises InvalidPayload only for a body that is neither an event nor a list of them.
    """
    if isinstance(payload, Mapping):
        if "items" in payload:
            raise events.InvalidPayload(
                "this is a Brevo inbound-parse body, not a transactional event"
            )
        items: Sequence[object] = [payload]
    elif isinstance(payload, list):
        items = payload
    else:
        raise events.InvalidPayload("a Brevo webhook body is a JSON object or a list of them")
    return events.parse_each(items, _parse_event)


def _parse_event(payload: object) -> events.ProviderEvent:
    if not isinstance(payload, Mapping):
        raise events.InvalidPayload("each Brevo event is a JSON object")
    name = payload.get("event")
    if not isinstance(name, str) or not name:
        raise events.InvalidPayload("the Brevo event has no 'event' name")
    if name not in BREVO_EVENTS:
        raise events.UnsupportedEvent(PROVIDER, event_fields.clean(name[:50]))
    kind, bounce_type = BREVO_EVENTS[name]

    occurred_at = _occurred_at(payload)
    provider_message_id = event_fields.identifier(
        payload.get("message-id"), PROVIDER_MESSAGE_ID_MAX
    )
    recipient = _recipient(payload.get("email"))
    link = _text(payload.get("link"))
    stamps = tuple(payload.get(field) for field in _TIMESTAMP_FIELDS)
    return events.keyed_event(
        PROVIDER,
        name,
        kind,
        bounce_type,
        occurred_at,
        recipient=recipient,
        provider_message_id=provider_message_id,
        message_id=_our_message_id(payload, provider_message_id),
        content=(name, provider_message_id, *stamps, link),
        detail=link if kind is K.CLICKED else _text(payload.get("reason")),
        raw=event_fields.raw_json(payload),
    )


def _occurred_at(payload: Mapping[str, Any]) -> datetime:
    for field in _TIMESTAMP_FIELDS:
        value = _number(payload.get(field))
        if value is None:
            continue
        seconds = value / 1000 if field == "ts_epoch" and value > _MILLISECONDS_ABOVE else value
        try:
            return event_fields.storable_time(datetime.fromtimestamp(seconds, tz=UTC))
        except (OverflowError, OSError, ValueError) as error:
            raise events.InvalidPayload(f"Brevo {field} is not a usable time") from error
    # `date` alone is local time of the account's zone; guessing it would misorder events.
    raise events.InvalidPayload("the Brevo event has no ts_epoch, ts_event or ts")


def _our_message_id(
    payload: Mapping[str, Any], provider_message_id: str | None
) -> uuid.UUID | None:
    for value in _header_values(payload, MESSAGE_ID_HEADER):
        found = events.message_id_from_value(value)
        if found is not None:
            return found
    # We send our own Message-Id header; where Brevo keeps it, its message-id is ours.
    return events.message_id_from_value(provider_message_id)


def _header_values(payload: Mapping[str, Any], name: str) -> Iterator[object]:
    """A custom header's values: Brevo puts them at the top level of the event, and some
    payloads nest them under "headers". Header names are case-insensitive."""
    wanted = name.lower()
    nested = payload.get("headers")
    for source in (payload, nested if isinstance(nested, Mapping) else {}):
        for key, value in source.items():
            if isinstance(key, str) and key.lower() == wanted:
                yield value


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.strip().isdecimal():
        try:
            return float(value)
        except ValueError:  # digits float() does not read
            return None
    return None


def _text(value: object) -> str | None:
    """A non-empty string field, stripped (Brevo's reasons come with stray spaces)."""
    return event_fields.text(value, ERROR_MAX)


def _recipient(value: object) -> str | None:
    address = events.normalize_recipient(event_fields.identifier(value, ADDRESS_MAX))
    return address if address is not None and len(address) <= ADDRESS_MAX else None
