"""Signing as Standard Webhooks specifies (https://www.standardwebhooks.com), so a receiver
can use any of its libraries, or `verify` here:

- headers `webhook-id` (the delivery's id: the same on every retry and replay, so a
  receiver dedups by it), `webhook-timestamp` (unix seconds of this attempt) and
  `webhook-signature` (`v1,<base64 HMAC-SHA256>`, several separated by spaces);
- signed content: `f"{webhook_id}.{timestamp}.{body}"`;
- the secret is `whsec_<base64 of 24 to 64 random bytes>`; the HMAC key is those bytes,
  stored sealed under HOOKS_KEY (`SecretBox`). Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping

SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret
SECRET_BYTES = 32
SIGNATURE_VERSION = "v1"
TOLERANCE_SECONDS = 5 * 60  # Standard Webhooks' suggested window for webhook-timestamp


class InvalidSignature(ValueError):
    """A webhook whose headers do not prove it came from the holder of the secret."""


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
