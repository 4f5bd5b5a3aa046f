"""Amazon SES events delivered by SNS: the SNS envelope, its signature, and the SES records
inside, parsed into `ProviderEvent`s.

Pure: the HTTP route reads the body, fetches the signing certificate (only from a URL that
`is_trusted_cert_url` accepts) and confirms subscriptions; this module parses and checks.
A route handles one POST as:

    msg = parse_sns_envelope(body)                      # InvalidSnsMessage -> 400
    if not is_trusted_cert_url(msg.signing_cert_url):   # -> 403
        ...
    verify_sns_signature(msg, fetched_certificate_pem, now=now)  # InvalidSignature -> 403
    check_fresh(msg, now)                               # StaleMessage -> 403
    if msg.message_type is SnsMessageType.NOTIFICATION:
        events = parse_ses_notification(msg.message)

Both SES formats are read: event publishing through a configuration set (`eventType`) and
identity feedback notifications (`notificationType`); their records have the same shape.
Every SES event type mailbag understands is in `SES_EVENTS`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature as _CryptoInvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from mailbag.compose import MESSAGE_ID_HEADER
from mailbag.domain import events
from mailbag.domain.message import ADDRESS_MAX, ERROR_MAX
from mailbag.providers import event_fields

PROVIDER: Final = "ses"
# The tag name providers/ses.py puts on every send (its MESSAGE_ID_TAG); kept here too so
# parsing events does not import botocore. A test checks the two agree.
MESSAGE_ID_TAG: Final = "mailbag_message_id"
DEFAULT_CERT_HOSTS: Final = r"^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$"
# What SNS publishes to a topic when SES starts using it: notices, not email events.
_INFORMATIONAL_TEXT: Final = "Successfully validated SNS topic for Amazon SES event publishing."
_INFORMATIONAL_TYPES: Final = frozenset({"AmazonSnsSubscriptionSucceeded"})
# How old a message may be: SNS stops retrying an HTTP(S) delivery after at most an hour
# (a hard limit), so an older one is a replay. A little leeway for clocks that disagree.
MAX_MESSAGE_AGE: Final = timedelta(hours=1, minutes=5)
CLOCK_LEEWAY: Final = timedelta(minutes=5)
PROVIDER_MESSAGE_ID_MAX: Final = 255  # the outbox column it is matched against


class InvalidSnsMessage(events.InvalidPayload):
    """A body that is not an SNS HTTP(S) message: the caller answers 400."""


class InvalidSignature(Exception):
    """The SNS message is not signed by the certificate's key (or cannot be checked)."""


class StaleMessage(InvalidSignature):
    """A validly signed message SNS sent too long ago (or in the future): a replay."""


class SnsMessageType(StrEnum):
    SUBSCRIPTION_CONFIRMATION = "SubscriptionConfirmation"
    NOTIFICATION = "Notification"
    UNSUBSCRIBE_CONFIRMATION = "UnsubscribeConfirmation"


@dataclass(frozen=True)
class SnsMessage:
    """One SNS HTTP(S) message. Every signed field keeps the exact text SNS sent, since the
    signature covers that text (the timestamp especially must not be re-formatted)."""

    message_type: SnsMessageType
    message_id: str  # SNS keeps it on redelivery of the same message
    topic_arn: str
    message: str
    timestamp: str
    signature_version: str  # "1": SHA1withRSA, "2": SHA256withRSA
    signature: str  # base64
    signing_cert_url: str
    subject: str | None = None
    subscribe_url: str | None = None  # confirmations only
    token: str | None = None  # confirmations only
    unsubscribe_url: str | None = None  # notifications only
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def sent_at(self) -> datetime:
        """When SNS sent it; a caller may refuse old messages to limit replays."""
        return _parse_time(self.timestamp, "SNS Timestamp")


# The keys, in this order, whose "Key\nvalue\n" lines form the text SNS signs
# (docs.aws.amazon.com/sns/latest/dg/sns-verify-signature-of-message.html). Subject is
# optional and left out when absent; every other key must be present.
_NOTIFICATION_KEYS: Final = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type")
_CONFIRMATION_KEYS: Final = (
    "Message",
    "MessageId",
    "SubscribeURL",
    "Timestamp",
    "Token",
    "TopicArn",
    "Type",
)
_SIGNED_KEYS: Final[Mapping[SnsMessageType, tuple[str, ...]]] = MappingProxyType(
    {
        SnsMessageType.NOTIFICATION: _NOTIFICATION_KEYS,
        SnsMessageType.SUBSCRIPTION_CONFIRMATION: _CONFIRMATION_KEYS,
        SnsMessageType.UNSUBSCRIBE_CONFIRMATION: _CONFIRMATION_KEYS,
    }
)
_OPTIONAL_KEYS: Final = frozenset({"Subject", "UnsubscribeURL"})
_SIGNATURE_KEYS: Final = ("SignatureVersion", "Signature", "SigningCertURL")
_SIGNATURE_HASHES: Final[Mapping[str, Callable[[], hashes.HashAlgorithm]]] = MappingProxyType(
    {"1": hashes.SHA1, "2": hashes.SHA256}
)
_MESSAGE_TYPES: Final = frozenset(t.value for t in SnsMessageType)


def parse_sns_envelope(body: bytes | str) -> SnsMessage:
    """The SNS message in an HTTP(S) POST body. Raises InvalidSnsMessage."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise InvalidSnsMessage("the SNS body is not JSON") from error
    if not isinstance(document, dict):
        raise InvalidSnsMessage("the SNS body is not a JSON object")
    declared_type = document.get("Type")
    if not isinstance(declared_type, str) or declared_type not in _MESSAGE_TYPES:
        raise InvalidSnsMessage(f"unknown SNS message Type {str(declared_type)[:50]!r}")
    message_type = SnsMessageType(declared_type)
    for key in (*_SIGNED_KEYS[message_type], *_SIGNATURE_KEYS):
        if key not in _OPTIONAL_KEYS and not isinstance(document.get(key), str):
            raise InvalidSnsMessage(f"SNS {message_type} without a string {key}")
    for key in _OPTIONAL_KEYS:
        if document.get(key) is not None and not isinstance(document[key], str):
            raise InvalidSnsMessage(f"SNS {key} is not a string")
    if document["SignatureVersion"] not in _SIGNATURE_HASHES:
        raise InvalidSnsMessage(
            f"unknown SNS SignatureVersion {document['SignatureVersion'][:20]!r}"
        )
    return SnsMessage(
        message_type=message_type,
        message_id=document["MessageId"],
        topic_arn=document["TopicArn"],
        message=document["Message"],
        timestamp=document["Timestamp"],
        signature_version=document["SignatureVersion"],
        signature=document["Signature"],
        signing_cert_url=document["SigningCertURL"],
        subject=document.get("Subject"),
        subscribe_url=document.get("SubscribeURL"),
        token=document.get("Token"),
        unsubscribe_url=document.get("UnsubscribeURL"),
        raw=document,
    )


def sns_string_to_sign(msg: SnsMessage) -> bytes:
    """The canonical text SNS signs for this message's type."""
    values = {
        "Message": msg.message,
        "MessageId": msg.message_id,
        "Subject": msg.subject,
        "SubscribeURL": msg.subscribe_url,
        "Timestamp": msg.timestamp,
        "Token": msg.token,
        "TopicArn": msg.topic_arn,
        "Type": msg.message_type.value,
    }
    lines = (
        f"{key}\n{values[key]}\n"
        for key in _SIGNED_KEYS[msg.message_type]
        if values[key] is not None
    )
    return "".join(lines).encode()


def verify_sns_signature(
    msg: SnsMessage, certificate_pem: bytes, *, now: datetime | None = None
) -> None:
    """Raise InvalidSignature unless the certificate's RSA key signed this message
    (PKCS#1 v1.5 with SHA1 for SignatureVersion 1, SHA256 for 2). With `now`, the
    certificate must also be within its validity period then.

    Whether the certificate is Amazon's is the caller's check: fetch it only from a URL
    `is_trusted_cert_url` accepts.
    """
    try:
        certificate = x509.load_pem_x509_certificate(certificate_pem)
    except ValueError as error:
        raise InvalidSignature("the signing certificate is not a PEM X.509 certificate") from error
    if now is not None and not (
        certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc
    ):
        raise InvalidSignature("the signing certificate is not valid at this time")
    public_key = certificate.public_key()
    if not isinstance(public_key, rsa.RSAPublicKey):
        raise InvalidSignature("the signing certificate does not hold an RSA key")
    hash_algorithm = _SIGNATURE_HASHES.get(msg.signature_version)
    if hash_algorithm is None:
        raise InvalidSignature(f"unknown SignatureVersion {msg.signature_version!r}")
    try:
        signature = base64.b64decode(msg.signature, validate=True)
    except (binascii.Error, ValueError) as error:
        raise InvalidSignature("the signature is not base64") from error
    try:
        public_key.verify(signature, sns_string_to_sign(msg), padding.PKCS1v15(), hash_algorithm())
    except _CryptoInvalidSignature as error:
        raise InvalidSignature("the SNS signature does not match the message") from error


def check_fresh(msg: SnsMessage, now: datetime) -> None:
    """Raise StaleMessage unless SNS sent the message within MAX_MESSAGE_AGE before `now`
    (a signature stays valid forever, so without this an old message could be replayed)."""
    try:
        sent_at = msg.sent_at
    except events.InvalidPayload as error:
        raise StaleMessage("the SNS Timestamp is not a time") from error
    if not now - MAX_MESSAGE_AGE <= sent_at <= now + CLOCK_LEEWAY:
        raise StaleMessage("the SNS message is too old (or from the future): a replay?")


def is_trusted_cert_url(url: str, allowed_hosts_pattern: str = DEFAULT_CERT_HOSTS) -> bool:
    """Whether a SigningCertURL may be fetched: https, and a host the pattern matches in
    full. Userinfo, backslashes, whitespace and control characters are refused outright, as
    URL parsers disagree about where such a URL's host is."""
    if not url.isprintable() or any(char.isspace() or char == "\\" for char in url):
        return False
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port  # raises for a malformed port
    except ValueError:
        return False
    if parts.scheme != "https" or host is None or "@" in parts.netloc:
        return False
    return re.fullmatch(allowed_hosts_pattern, host) is not None


# --- SES records ---------------------------------------------------------------------------

Detail = Callable[[Mapping[str, Any], Mapping[str, Any]], str | None]


@dataclass(frozen=True)
class SesEventRule:
    kind: events.EventKind
    body_key: str  # the record's event-specific object ("bounce", "delivery", ...)
    # The list in that object naming the recipients it concerns (one event each); None:
    # the event is about the whole email, one event per `mail.destination` address.
    recipients_key: str | None
    # The human detail, from the event object and the recipient's entry in its list.
    detail: Detail


def _no_detail(body: Mapping[str, Any], entry: Mapping[str, Any]) -> str | None:
    return None


def _field(name: str) -> Detail:
    def read(body: Mapping[str, Any], entry: Mapping[str, Any]) -> str | None:
        return _text(body.get(name))

    return read


def _bounce_detail(body: Mapping[str, Any], entry: Mapping[str, Any]) -> str | None:
    kind = "/".join(
        t for t in (_text(body.get("bounceType")), _text(body.get("bounceSubType"))) if t
    )
    diagnostic = _text(entry.get("diagnosticCode")) or _text(entry.get("status"))
    return ": ".join(part for part in (kind, diagnostic) if part) or None


def _delay_detail(body: Mapping[str, Any], entry: Mapping[str, Any]) -> str | None:
    parts = (_text(body.get("delayType")), _text(entry.get("diagnosticCode")))
    return ": ".join(part for part in parts if part) or None


def _complaint_detail(body: Mapping[str, Any], entry: Mapping[str, Any]) -> str | None:
    return _text(body.get("complaintFeedbackType")) or _text(body.get("complaintSubType"))


K = events.EventKind
# SES eventType / notificationType -> how to read it. From docs.aws.amazon.com/ses/latest/dg/
# event-publishing-retrieving-sns-contents.html (Rendering Failure has a space, its object
# is "failure").
SES_EVENTS: Final[Mapping[str, SesEventRule]] = MappingProxyType(
    {
        "Send": SesEventRule(K.ACCEPTED, "send", None, _no_detail),
        "Delivery": SesEventRule(K.DELIVERED, "delivery", "recipients", _field("smtpResponse")),
        "DeliveryDelay": SesEventRule(
            K.DEFERRED, "deliveryDelay", "delayedRecipients", _delay_detail
        ),
        "Bounce": SesEventRule(K.BOUNCED, "bounce", "bouncedRecipients", _bounce_detail),
        "Complaint": SesEventRule(
            K.COMPLAINED, "complaint", "complainedRecipients", _complaint_detail
        ),
        "Reject": SesEventRule(K.REJECTED, "reject", None, _field("reason")),
        "Rendering Failure": SesEventRule(K.REJECTED, "failure", None, _field("errorMessage")),
        "Open": SesEventRule(K.OPENED, "open", None, _no_detail),
        "Click": SesEventRule(K.CLICKED, "click", None, _field("link")),
        "Subscription": SesEventRule(K.UNSUBSCRIBED, "subscription", None, _no_detail),
    }
)
# SES bounceType -> ours. Undetermined (SES could not tell) counts as soft: suppressing an
# address on a guess would silence a working one. Any new value is soft for the same reason.
SES_BOUNCE_TYPES: Final[Mapping[str, events.BounceType]] = MappingProxyType(
    {
        "Permanent": events.BounceType.HARD,
        "Transient": events.BounceType.SOFT,
        "Undetermined": events.BounceType.SOFT,
    }
)


def parse_ses_notification(message_json: str | Mapping[str, Any]) -> list[events.ProviderEvent]:
    """The events in one SES record (an SNS Notification's Message): one per recipient the
    record names. SNS's own notices about the topic give an empty list.

    Raises InvalidPayload for a record SES would not send and UnsupportedEvent for an event
    type missing from SES_EVENTS.
    """
    record = _load_record(message_json)
    if record is None:
        return []
    name = record.get("eventType", record.get("notificationType"))
    if not isinstance(name, str) or not name:
        raise events.InvalidPayload("the SES record has no eventType or notificationType")
    if name in _INFORMATIONAL_TYPES:
        return []
    if name not in SES_EVENTS:
        raise events.UnsupportedEvent(PROVIDER, name)
    rule = SES_EVENTS[name]

    mail = _object(record, "mail")
    body = _object(record, rule.body_key)
    provider_message_id = event_fields.identifier(mail.get("messageId"), PROVIDER_MESSAGE_ID_MAX)
    occurred_at = _parse_time(body.get("timestamp") or mail.get("timestamp"), "SES timestamp")
    raw = event_fields.raw_json(record)
    our_id = _our_message_id(mail)
    bounce_type = None
    if rule.kind is K.BOUNCED:
        bounce_type = SES_BOUNCE_TYPES.get(str(body.get("bounceType")), events.BounceType.SOFT)
    feedback_id = _text(body.get("feedbackId"))  # bounces and complaints only
    link = _text(body.get("link"))

    found = []
    for address, entry in _recipients(mail, body, rule.recipients_key):
        recipient = events.normalize_recipient(event_fields.identifier(address, ADDRESS_MAX))
        if recipient is not None and len(recipient) > ADDRESS_MAX:
            recipient = None
        found.append(
            events.keyed_event(
                PROVIDER,
                name,
                rule.kind,
                bounce_type,
                occurred_at,
                recipient=recipient,
                provider_message_id=provider_message_id,
                message_id=our_id,
                provider_event_id=feedback_id,
                content=(name, provider_message_id, occurred_at.isoformat(), link),
                detail=rule.detail(body, entry),
                raw=raw,
            )
        )
    return found


def _load_record(message_json: str | Mapping[str, Any]) -> Mapping[str, Any] | None:
    if isinstance(message_json, Mapping):
        return message_json
    try:
        record = json.loads(message_json)
    except (ValueError, RecursionError) as error:
        if message_json.strip() == _INFORMATIONAL_TEXT:
            return None
        raise events.InvalidPayload("the SNS Message is not an SES JSON record") from error
    if not isinstance(record, dict):
        raise events.InvalidPayload("the SES record is not a JSON object")
    return record


def _recipients(
    mail: Mapping[str, Any], body: Mapping[str, Any], key: str | None
) -> Iterator[tuple[object, Mapping[str, Any]]]:
    """(address, its entry) for each recipient the record concerns. Entries are strings
    (delivery.recipients, mail.destination) or objects with an emailAddress. A record that
    names nobody still yields one event, for recipient None: its message-level news (a
    reject, an undelivered bounce) must not vanish."""
    listed = body.get(key) if key is not None else mail.get("destination")
    entries = listed if isinstance(listed, list) else []
    for entry in entries:
        if isinstance(entry, Mapping):
            yield entry.get("emailAddress"), entry
        else:
            yield entry, {}
    if not entries:
        yield None, {}


def _our_message_id(mail: Mapping[str, Any]) -> uuid.UUID | None:
    """From our header, else our tag, else our Message-ID (SES keeps the original headers
    in mail.headers when the configuration set includes them; tags come with event
    publishing only)."""
    headers = mail.get("headers")
    header_list = (
        [h for h in headers if isinstance(h, Mapping)] if isinstance(headers, list) else []
    )
    tags = mail.get("tags")
    tag_values = tags.get(MESSAGE_ID_TAG) if isinstance(tags, Mapping) else None
    common = mail.get("commonHeaders")
    candidates: list[object] = [
        *_header_values(header_list, MESSAGE_ID_HEADER),
        *(tag_values if isinstance(tag_values, list) else [tag_values]),
        *_header_values(header_list, "Message-ID"),
        common.get("messageId") if isinstance(common, Mapping) else None,
    ]
    for value in candidates:
        found = events.message_id_from_value(value)
        if found is not None:
            return found
    return None


def _header_values(headers: list[Mapping[str, Any]], name: str) -> Iterator[object]:
    wanted = name.lower()
    for header in headers:
        header_name = header.get("name")
        if isinstance(header_name, str) and header_name.lower() == wanted:
            yield header.get("value")


def _object(record: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = record.get(key, {})
    if not isinstance(value, Mapping):
        raise events.InvalidPayload(f"the SES record's {key!r} is not an object")
    return value


def _parse_time(value: object, what: str) -> datetime:
    """An ISO 8601 time as SES and SNS write it (2017-08-05T00:41:02.669Z), in UTC, that
    every database can store."""
    if not isinstance(value, str):
        raise events.InvalidPayload(f"{what} is missing")
    try:
        parsed = datetime.fromisoformat(value)
        # Both services document UTC; a time without an offset is taken as UTC.
        utc = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
        return event_fields.storable_time(utc)
    except (ValueError, OverflowError) as error:  # year 1 at +14:00 overflows
        raise events.InvalidPayload(f"{what} {value[:40]!r} is not an ISO 8601 time") from error


def _text(value: object) -> str | None:
    return event_fields.text(value, ERROR_MAX)
