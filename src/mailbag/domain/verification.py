"""The email-verification workflow as durable state: states, transitions, tokens, limits.

    created -> send_pending -> sent -> verified
                    |            \\-> (resend) send_pending
                    '-> send_failed                            any unfinished -> expired

The verification follows its current outbox message (sent -> `sent`, failed or dead ->
`send_failed`, unknown stays `send_pending`), and only that message: a late result for an
older, rotated send is ignored. `verified` and `expired` are final, so a late failure can
never move a verified address backwards. A new request after expiry makes a new row.

Tokens are not random: send n of verification v carries HMAC(token key, "v:n"), the token
key being derived from the deployment's secret key, which is never in the database. The
database holds only the token's digest and, in the email's outbox row, the reference
(v, n, redirect URL) that the worker turns back into the token and the link just before
rendering. A dump, a replica or a backup can therefore confirm nothing, and the same
send always renders the same token, so a retried email still matches the stored digest.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from mailbag.domain.machine import Machine, Transition, from_each
from mailbag.domain.message import Message
from mailbag.domain.states import Status


class VState(StrEnum):
    CREATED = "created"
    SEND_PENDING = "send_pending"
    SENT = "sent"
    SEND_FAILED = "send_failed"
    VERIFIED = "verified"
    EXPIRED = "expired"


class VAction(StrEnum):
    CREATE = "create"
    ENQUEUE = "enqueue"  # its email is in the outbox
    SUPPRESSED = "suppressed"  # its email failed at once (suppressed address)
    MESSAGE_SENT = "message_sent"
    MESSAGE_FAILED = "message_failed"
    MESSAGE_REQUEUED = "message_requeued"
    RESEND = "resend"
    CONFIRM = "confirm"
    EXPIRE = "expire"


V, VA = VState, VAction
# Its email was enqueued, whatever became of it: it may be resent, or confirmed.
ENQUEUED = (V.SEND_PENDING, V.SENT, V.SEND_FAILED)
UNFINISHED = (V.CREATED, *ENQUEUED)

TRANSITIONS: tuple[Transition[VState, VAction], ...] = (
    Transition(None, VA.CREATE, V.CREATED),
    Transition(V.CREATED, VA.ENQUEUE, V.SEND_PENDING),
    Transition(V.CREATED, VA.SUPPRESSED, V.SEND_FAILED),
    Transition(V.SEND_PENDING, VA.MESSAGE_SENT, V.SENT),
    Transition(V.SEND_PENDING, VA.MESSAGE_FAILED, V.SEND_FAILED),
    Transition(V.SEND_FAILED, VA.MESSAGE_REQUEUED, V.SEND_PENDING),
    *from_each(ENQUEUED, VA.RESEND, V.SEND_PENDING),
    # Holding the token proves the email arrived, whatever the outbox concluded.
    *from_each(ENQUEUED, VA.CONFIRM, V.VERIFIED),
    *from_each(UNFINISHED, VA.EXPIRE, V.EXPIRED),
)

VERIFICATIONS: Machine[VState, VAction] = Machine(TRANSITIONS)

# At most one of these per (tenant, email): enforced by a (partial) unique index.
ACTIVE: frozenset[VState] = frozenset({V.CREATED, V.SEND_PENDING, V.SENT})
FINAL: frozenset[VState] = frozenset({V.VERIFIED, V.EXPIRED})
MAX_CONFIRM_ATTEMPTS = 5

# How an outbox message's new state moves the verification that sent it.
FOLLOWS: dict[Status, VAction] = {
    Status.SENT: VA.MESSAGE_SENT,
    Status.FAILED: VA.MESSAGE_FAILED,
    Status.DEAD: VA.MESSAGE_FAILED,
    Status.EXPIRED: VA.MESSAGE_FAILED,  # not sent in time: as failed, for the verification
    Status.PENDING: VA.MESSAGE_REQUEUED,
}


# The purpose the token key is derived for (keys.derive(deployment key, TOKEN_PURPOSE)).
TOKEN_PURPOSE = "verification-token"  # noqa: S105 - a label, not a secret
# Template fields that carry the secret: filled in at render time, never stored or shown.
SECRET_FIELDS = ("token", "link")


def token_for(token_key: bytes, verification_id: uuid.UUID, send_number: int) -> str:
    """The token of one send: 256 bits, URL-safe base64 (43 characters, easy to copy)."""
    mac = hmac.new(token_key, f"{verification_id}:{send_number}".encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode()


def link_for(redirect_url: str | None, verification_id: uuid.UUID, token: str) -> str | None:
    """The caller's redirect URL with the verification id and token added to its query."""
    if not redirect_url:
        return None
    parts = urlsplit(redirect_url)
    extra = urlencode({"verification_id": str(verification_id), "token": token})
    query = f"{parts.query}&{extra}" if parts.query else extra
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


@dataclass(frozen=True)
class EmailReference:
    """What a verification email's outbox row holds instead of its secret: which send it
    is. Kept in the message's metadata; nothing in it confirms anything."""

    verification_id: uuid.UUID
    send_number: int
    redirect_url: str | None

    def metadata(self) -> dict[str, Any]:
        return {
            "verification_id": str(self.verification_id),
            "verification_send": self.send_number,
            "redirect_url": self.redirect_url,
            "secret_fields": list(SECRET_FIELDS),
        }

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> EmailReference | None:
        """The reference, or None for other messages (and for emails written before tokens
        were derived: those still carry their token in their data)."""
        send = metadata.get("verification_send")
        if not isinstance(send, int) or "verification_id" not in metadata:
            return None
        redirect_url = metadata.get("redirect_url")
        return cls(
            uuid.UUID(str(metadata["verification_id"])),
            send,
            redirect_url if isinstance(redirect_url, str) else None,
        )

    def secrets(self, token: str) -> dict[str, str | None]:
        """The secret template fields for this send, given its token."""
        return {"token": token, "link": link_for(self.redirect_url, self.verification_id, token)}


@dataclass(frozen=True)
class Tokens:
    """Each send's token, derived from the token key (never stored in the database)."""

    key: bytes = field(repr=False)

    def token(self, verification_id: uuid.UUID, send_number: int) -> str:
        return token_for(self.key, verification_id, send_number)

    def secrets_for(self, message: Message) -> dict[str, str | None]:
        """The secret fields a verification email renders with; {} for other messages."""
        ref = EmailReference.from_metadata(message.metadata)
        if ref is None:
            return {}
        return ref.secrets(self.token(ref.verification_id, ref.send_number))


def digest(secret: str) -> str:
    # The secrets are random and long, so a fast hash is enough: nothing to brute-force.
    return hashlib.sha256(secret.encode()).hexdigest()


def matches(secret: str, stored_digest: str) -> bool:
    return hmac.compare_digest(digest(secret), stored_digest)
