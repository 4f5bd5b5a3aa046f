"""Event hooks: what a tenant subscribes to, what a receiver gets, and how it is signed.

A tenant registers endpoints (a URL and the events it wants). Every event about one of the
tenant's messages becomes one delivery per subscribed endpoint, written in the transaction
that changed the message, and a worker POSTs it until the endpoint answers 2xx or the
attempts are spent (the delivery's states are `DELIVERIES`, a `Machine` as for messages).

Signing follows Standard Webhooks (https://www.standardwebhooks.com), so a receiver can use
any of its libraries, or `verify` below:

- headers `webhook-id` (the delivery's id: the same on every retry and replay, so a
  receiver dedups by it), `webhook-timestamp` (unix seconds of this attempt) and
  `webhook-signature` (`v1,<base64 HMAC-SHA256>`, several separated by spaces);
- signed content: `f"{webhook_id}.{timestamp}.{body}"`;
- the secret is `whsec_<base64 of 24 to 64 random bytes>`; the HMAC key is those bytes.

A payload says what happened to a message, never what it said: no template data, bodies,
headers or secrets. Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from ipaddress import ip_address
from typing import Any
from urllib.parse import urlsplit

from mailbag.domain.events import EventKind
from mailbag.domain.machine import Counted, Machine, Transition
from mailbag.domain.states import Status

SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret
SECRET_BYTES = 32
SIGNATURE_VERSION = "v1"
TOLERANCE_SECONDS = 5 * 60  # Standard Webhooks' suggested window for webhook-timestamp
URL_MAX = 2000
DESCRIPTION_MAX = 500
ERROR_MAX = 1000
# The hosts an `http://` URL may name when HOOK_ALLOW_HTTP_LOCALHOST is set (tests, local
# development): nothing else ever gets a hook in clear text.
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


class HookEvent(StrEnum):
    """What a tenant can subscribe to; the value is the payload's `type`."""

    # Our worker's sends (store/message_transitions.transition).
    SENT = "message.sent"  # the provider accepted it
    FAILED = "message.failed"  # refused for good (a permanent error, a suppressed address)
    DEAD = "message.dead"  # the attempts ran out
    UNKNOWN = "message.unknown"  # the provider may or may not have taken it
    # What the provider reported afterwards (store/events.store, matched to a message).
    DELIVERED = "message.delivered"
    BOUNCED = "message.bounced"
    COMPLAINED = "message.complained"
    OPENED = "message.opened"
    CLICKED = "message.clicked"

    @property
    def short(self) -> str:
        """The name without `message.`: what the CLI and the API also accept."""
        return self.value.removeprefix("message.")


ALL_EVENTS: frozenset[HookEvent] = frozenset(HookEvent)
# Which message state change is which event (a message entering the state; `flag` keeps a
# message `unknown` and is no event), and which provider event kind is which.
FOR_STATUS: Mapping[Status, HookEvent] = {
    Status.SENT: HookEvent.SENT,
    Status.FAILED: HookEvent.FAILED,
    Status.DEAD: HookEvent.DEAD,
    Status.UNKNOWN: HookEvent.UNKNOWN,
}
# Accepted and deferred say nothing a `sent` did not; rejected and unsubscribed are not
# offered (a rejection of an `unknown` send becomes `message.failed` when reconciled).
FOR_PROVIDER_EVENT: Mapping[EventKind, HookEvent] = {
    EventKind.DELIVERED: HookEvent.DELIVERED,
    EventKind.BOUNCED: HookEvent.BOUNCED,
    EventKind.COMPLAINED: HookEvent.COMPLAINED,
    EventKind.OPENED: HookEvent.OPENED,
    EventKind.CLICKED: HookEvent.CLICKED,
}


class InvalidHook(ValueError):
    """An endpoint the rules refuse; `errors` maps each field to what is wrong (a 422)."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{field}: {problem}" for field, problem in self.errors.items()))


class InvalidSignature(ValueError):
    """A webhook whose headers do not prove it came from the holder of the secret."""


# --- Endpoints -------------------------------------------------------------------------


@dataclass(frozen=True)
class HookEndpoint:
    """Where a tenant's events go. The secret is not here: it is shown once (create,
    rotate) and stored encrypted."""

    id: uuid.UUID
    tenant_id: str
    url: str
    events: frozenset[HookEvent]
    enabled: bool
    description: str | None
    created_at: datetime
    updated_at: datetime

    def wants(self, event: HookEvent) -> bool:
        return self.enabled and event in self.events


def parse_events(names: Iterable[str]) -> frozenset[HookEvent]:
    """The events named, as `message.sent` or `sent`; `*` means all of them. InvalidHook
    names the unknown ones; an empty selection is refused (it would never fire)."""
    chosen: set[HookEvent] = set()
    unknown: list[str] = []
    by_name = {e.value: e for e in HookEvent} | {e.short: e for e in HookEvent}
    for name in names:
        text = name.strip().lower()
        if text == "*":
            chosen |= ALL_EVENTS
        elif text in by_name:
            chosen.add(by_name[text])
        else:
            unknown.append(name)
    if unknown:
        known = ", ".join(e.short for e in HookEvent)
        raise InvalidHook({"events": f"unknown event(s) {', '.join(unknown)}; known: {known}"})
    if not chosen:
        raise InvalidHook({"events": "name at least one event"})
    return frozenset(chosen)


def events_column(events: Iterable[HookEvent]) -> str:
    """How an endpoint's events are stored: `,sent,bounced,` (each name between commas),
    so that the fan-out's `LIKE '%,sent,%'` matches whole names only."""
    return "," + ",".join(sorted(e.short for e in events)) + ","


def events_from_column(value: str) -> frozenset[HookEvent]:
    return frozenset(HookEvent(f"message.{name}") for name in value.strip(",").split(",") if name)


def check_url(url: str, *, allow_http_localhost: bool = False) -> str:
    """The URL if hooks may be sent to it: https, a host, no credentials in it, at most
    URL_MAX characters; `http://` only to localhost when `allow_http_localhost`. Else
    InvalidHook."""
    problem = _url_problem(url.strip(), allow_http_localhost)
    if problem:
        raise InvalidHook({"url": problem})
    return url.strip()


def _url_problem(url: str, allow_http_localhost: bool) -> str | None:
    if not url or len(url) > URL_MAX:
        return f"must be 1 to {URL_MAX} characters"
    if any(ch.isspace() or ord(ch) < 0x20 for ch in url):
        return "must not contain spaces or control characters"
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a port out of range
    except ValueError as exc:
        return f"is not a valid URL: {exc}"
    if parts.scheme not in ("https", "http") or not host:
        return "must be an https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials; the signature authenticates mailbag"
    if parts.fragment:
        return "must not have a #fragment"
    if parts.scheme == "http":
        if not allow_http_localhost:
            return "must use https://"
        if host.lower() not in LOCAL_HOSTS and not _is_loopback(host):
            return "may use http:// only for localhost"
    return None


def _is_loopback(host: str) -> bool:
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def check_description(description: str | None) -> str | None:
    if description is None or not description.strip():
        return None
    if len(description) > DESCRIPTION_MAX:
        raise InvalidHook({"description": f"must be at most {DESCRIPTION_MAX} characters"})
    return description.strip()


# --- Secrets ---------------------------------------------------------------------------


def new_secret() -> str:
    """A fresh signing secret, `whsec_<base64>` as Standard Webhooks libraries expect."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def parse_secret(secret: str) -> bytes:
    """The HMAC key of a `whsec_...` secret (the prefix is optional). ValueError if the
    rest is not base64."""
    text = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("a webhook secret is whsec_ followed by base64") from exc
    if not key:
        raise ValueError("a webhook secret is whsec_ followed by base64")
    return key


class SecretBox:
    """Endpoint secrets at rest: Fernet (AES-128-CBC + HMAC-SHA256) under a key derived
    from HOOKS_KEY, so a database dump holds no usable secret. Opening a secret sealed
    under another key raises `WrongHooksKey`."""

    def __init__(self, hooks_key: str) -> None:
        if not hooks_key:
            raise ValueError("an empty HOOKS_KEY turns hooks off; it cannot encrypt")
        from cryptography.fernet import Fernet  # only where secrets are sealed or opened

        digest = hashlib.sha256(f"mailbag/hooks/{hooks_key}".encode()).digest()
        self._fernet = Fernet(base64.urlsafe_b64encode(digest))

    def seal(self, secret: str) -> str:
        return self._fernet.encrypt(secret.encode()).decode("ascii")

    def open(self, sealed: str) -> str:
        from cryptography.fernet import InvalidToken

        try:
            return self._fernet.decrypt(sealed.encode("ascii")).decode()
        except InvalidToken as exc:
            raise WrongHooksKey(
                "an endpoint secret does not open with this HOOKS_KEY (was the key changed?)"
            ) from exc


class WrongHooksKey(RuntimeError):
    """A stored secret was sealed under another HOOKS_KEY."""


# --- Signing ---------------------------------------------------------------------------


def sign(secret: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256 of "{msg_id}.{timestamp}.{body}">`: webhook-signature."""
    content = msg_id.encode() + b"." + str(timestamp).encode() + b"." + body
    mac = hmac.new(secret, content, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(mac).decode()}"


def signed_headers(secret: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers of one attempt."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }


def verify(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
    tolerance: int = TOLERANCE_SECONDS,
) -> str:
    """Check a received webhook; return its webhook-id (dedup by it), else raise
    InvalidSignature. `secret` is the `whsec_...` string or its bytes; `headers` is any
    mapping (lower-case names, or a case-insensitive one such as httpx's or Starlette's).

    A timestamp further than `tolerance` seconds from `now` is refused (replays of an old
    capture); any one of the space-separated `v1,` signatures may match (secret rotation),
    compared in constant time."""
    key = parse_secret(secret) if isinstance(secret, str) else secret
    lower = {name.lower(): value for name, value in headers.items()}
    msg_id = lower.get("webhook-id", "")
    stamp = lower.get("webhook-timestamp", "")
    offered = lower.get("webhook-signature", "")
    if not msg_id or not stamp or not offered:
        raise InvalidSignature("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        timestamp = int(stamp)
    except ValueError as exc:
        raise InvalidSignature("webhook-timestamp is not an integer") from exc
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise InvalidSignature("webhook-timestamp is outside the tolerance window")
    expected = sign(key, msg_id, timestamp, body).partition(",")[2].encode()
    for candidate in offered.split():
        version, _, signature = candidate.partition(",")
        if version == SIGNATURE_VERSION and hmac.compare_digest(signature.encode(), expected):
            return msg_id
    raise InvalidSignature("no signature matches")


# --- Deliveries ------------------------------------------------------------------------


class DState(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    RETRYING = "retrying"
    DELIVERED = "delivered"
    DEAD = "dead"


class DAction(StrEnum):
    CREATE = "create"  # the fan-out writes it with the message's change
    CLAIM = "claim"  # a worker takes it under a lease
    DELIVER = "deliver"  # the endpoint answered 2xx
    RETRY = "retry"  # anything else, attempts left
    BURY = "bury"  # anything else, attempts spent
    EXPIRE = "expire"  # the lease ran out (a worker died mid-POST): try again
    RELEASE = "release"  # handed back without a POST (shutdown, endpoint disabled)
    REPLAY = "replay"  # an operator sends it again, same webhook-id


_D, _A = DState, DAction
_NEVER_TRIED, _TRIED = Counted("attempts", positive=False), Counted("attempts", True)
DELIVERY_TRANSITIONS: tuple[Transition[DState, DAction], ...] = (
    Transition(None, _A.CREATE, _D.PENDING),
    Transition(_D.PENDING, _A.CLAIM, _D.PROCESSING),
    Transition(_D.RETRYING, _A.CLAIM, _D.PROCESSING),
    Transition(_D.PROCESSING, _A.DELIVER, _D.DELIVERED),
    Transition(_D.PROCESSING, _A.RETRY, _D.RETRYING),
    Transition(_D.PROCESSING, _A.BURY, _D.DEAD),
    # A POST may have reached the receiver before the worker died: at least once, so retry.
    Transition(_D.PROCESSING, _A.EXPIRE, _D.RETRYING),
    Transition(_D.PROCESSING, _A.RELEASE, _D.PENDING, when=_NEVER_TRIED),
    Transition(_D.PROCESSING, _A.RELEASE, _D.RETRYING, when=_TRIED),
    Transition(_D.DELIVERED, _A.REPLAY, _D.PENDING),
    Transition(_D.DEAD, _A.REPLAY, _D.PENDING),
)
DELIVERIES: Machine[DState, DAction] = Machine(DELIVERY_TRANSITIONS)
CLAIMABLE_DELIVERIES: frozenset[DState] = DELIVERIES.sources(DAction.CLAIM)
REPLAYABLE: frozenset[DState] = DELIVERIES.sources(DAction.REPLAY)


@dataclass(frozen=True)
class HookDelivery:
    """One event for one endpoint. `payload` is the exact body POSTed (the same bytes on
    every attempt); `webhook_id` is the `webhook-id` header, stable across retries and
    replays."""

    id: uuid.UUID
    endpoint_id: uuid.UUID
    tenant_id: str
    event: HookEvent
    message_id: uuid.UUID
    webhook_id: str
    payload: str
    status: DState
    attempts: int
    max_attempts: int
    next_attempt_at: datetime
    last_error: str | None
    last_status_code: int | None
    created_at: datetime
    updated_at: datetime
    delivered_at: datetime | None
    url: str | None = None  # the endpoint's, when the reader joined it


@dataclass(frozen=True)
class DeliveryEvent:
    """One move of a delivery (its attempts and operators' replays), oldest first."""

    id: int
    delivery_id: uuid.UUID
    from_status: DState | None
    to_status: DState
    at: datetime
    actor: str
    attempt: int
    status_code: int | None
    detail: str | None


def webhook_id_for(event_id: uuid.UUID) -> str:
    """`msg_<32 hex>`: the webhook-id of one event, the same for each endpoint it goes to
    and on every retry and replay (Standard Webhooks' examples use msg_)."""
    return f"msg_{event_id.hex}"


def outcome(status_code: int | None) -> bool:
    """Whether an attempt delivered: any 2xx. Redirects are not followed: a 3xx fails."""
    return status_code is not None and 200 <= status_code < 300


# --- Payloads --------------------------------------------------------------------------


@dataclass(frozen=True)
class MessageFacts:
    """What a payload may say about a message: its state and the provider's answer, never
    its content."""

    message_id: uuid.UUID
    tenant_id: str
    status: str
    to: str | None = None
    template: str | None = None
    subject: str | None = None
    provider_message_id: str | None = None
    error: str | None = None
    metadata: Mapping[str, Any] | None = None
    # From a provider's event:
    recipient: str | None = None
    bounce_type: str | None = None
    detail: str | None = None  # bounce diagnostic, clicked link ...
    provider: str | None = None


def payload(event: HookEvent, facts: MessageFacts, occurred_at: datetime) -> str:
    """The JSON body of a delivery: `{"type", "timestamp", "data"}` (Standard Webhooks'
    recommended shape). Keys with no value are left out, so a payload stays small."""
    data: dict[str, Any] = {
        "message_id": str(facts.message_id),
        "tenant_id": facts.tenant_id,
        "status": facts.status,
        "to": facts.to,
        "template": facts.template,
        "subject": facts.subject,
        "provider": facts.provider,
        "provider_message_id": facts.provider_message_id,
        "error": facts.error[:ERROR_MAX] if facts.error else None,
        "recipient": facts.recipient,
        "bounce_type": facts.bounce_type,
        "detail": facts.detail[:ERROR_MAX] if facts.detail else None,
        "metadata": dict(facts.metadata) if facts.metadata else None,
    }
    body = {
        "type": event.value,
        "timestamp": occurred_at.isoformat().replace("+00:00", "Z"),
        "data": {key: value for key, value in data.items() if value is not None},
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str)
