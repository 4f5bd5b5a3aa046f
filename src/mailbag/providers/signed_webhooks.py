"""What the webhooks their provider signs share (SendGrid's and Mailgun's; SES's SNS messages
have rules of their own in ses_events): how a refusal is said, the replay window, and the
Unix times and recipients their events carry.

    InvalidSignature          the request does not prove it came from the provider (403)
    ├── Unsigned              it carries no signature at all (401)
    └── StaleMessage          signed, but at a time outside the replay window: a replay? (403)

A signature never expires, so a captured request could be sent again any time: each signed
request carries the time it was signed at, and one signed more than `REPLAY_WINDOW` away
from now (either way: clocks differ) is refused, the window Standard Webhooks suggests and
mailbag's own hooks use. Within the window a replay is stored once at most: the events'
dedup keys (SendGrid's `sg_event_id`, Mailgun's one-time `token`) see it again. Pure.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Final

from mailbag.domain.events import InvalidPayload, normalize_recipient
from mailbag.domain.hooks.signing import TOLERANCE_SECONDS
from mailbag.domain.message import ADDRESS_MAX
from mailbag.providers import event_fields
from mailbag.providers.ses_events import InvalidSignature, StaleMessage

REPLAY_WINDOW: Final = timedelta(seconds=TOLERANCE_SECONDS)


class Unsigned(InvalidSignature):
    """The request carries no signature (or not all of its parts)."""


def signed_at(stamp: object, now: datetime, *, window: timedelta = REPLAY_WINDOW) -> datetime:
    """The time a request was signed at, from its Unix seconds (a string or a number).
    Raises StaleMessage when it is further than `window` from `now`, InvalidSignature when
    it is no time at all."""
    if isinstance(stamp, bool) or not isinstance(stamp, str | int | float):
        raise InvalidSignature("the signature's timestamp is not a number")
    try:
        seconds = float(stamp)
    except ValueError:
        raise InvalidSignature("the signature's timestamp is not a number") from None
    if not math.isfinite(seconds) or abs(seconds - now.timestamp()) > window.total_seconds():
        raise StaleMessage(
            f"signed more than {int(window.total_seconds())} seconds from now: a replay?"
        )
    return datetime.fromtimestamp(seconds, tz=UTC)


def json_body(body: bytes, provider: str) -> object:
    """A webhook body's JSON; InvalidPayload when it is not JSON (or nests deeper than the
    parser goes)."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise InvalidPayload(f"a {provider} webhook body is JSON") from None


def event_time(value: object, provider: str) -> datetime:
    """An event's time from its Unix seconds (a number); InvalidPayload when it has none
    or one no database can store."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidPayload(f"the {provider} event has no numeric 'timestamp'")
    try:
        return event_fields.storable_time(datetime.fromtimestamp(value, tz=UTC))
    except (OverflowError, OSError, ValueError) as error:
        raise InvalidPayload(f"the {provider} timestamp is not a usable time") from error


def event_recipient(value: object) -> str | None:
    """The event's recipient as the outbox stores addresses; None when it names none we
    could store (or match)."""
    address = normalize_recipient(event_fields.identifier(value, ADDRESS_MAX))
    return address if address is not None and len(address) <= ADDRESS_MAX else None


__all__ = [
    "REPLAY_WINDOW",
    "InvalidSignature",
    "StaleMessage",
    "Unsigned",
    "event_recipient",
    "event_time",
    "json_body",
    "signed_at",
]
