"""The email-verification workflow as durable state: states, transitions, tokens, limits.

    created -> send_pending -> sent -> verified
                    |            \\-> (resend) send_pending
                    '-> send_failed                            any unfinished -> expired

The verification follows its current outbox message (sent -> `sent`, failed or dead ->
`send_failed`, unknown stays `send_pending`), and only that message: a late result for an
older, rotated send is ignored. `verified` and `expired` are final, so a late failure can
never move a verified address backwards. A new request after expiry makes a new row.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import StrEnum

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


@dataclass(frozen=True)
class VTransition:
    source: VState | None
    action: VAction
    target: VState


V, VA = VState, VAction
UNFINISHED = (V.CREATED, V.SEND_PENDING, V.SENT, V.SEND_FAILED)

V_TRANSITIONS: tuple[VTransition, ...] = (
    VTransition(None, VA.CREATE, V.CREATED),
    VTransition(V.CREATED, VA.ENQUEUE, V.SEND_PENDING),
    VTransition(V.CREATED, VA.SUPPRESSED, V.SEND_FAILED),
    VTransition(V.SEND_PENDING, VA.MESSAGE_SENT, V.SENT),
    VTransition(V.SEND_PENDING, VA.MESSAGE_FAILED, V.SEND_FAILED),
    VTransition(V.SEND_FAILED, VA.MESSAGE_REQUEUED, V.SEND_PENDING),
    VTransition(V.SEND_PENDING, VA.RESEND, V.SEND_PENDING),
    VTransition(V.SENT, VA.RESEND, V.SEND_PENDING),
    VTransition(V.SEND_FAILED, VA.RESEND, V.SEND_PENDING),
    # Holding the token proves the email arrived, whatever the outbox concluded.
    VTransition(V.SEND_PENDING, VA.CONFIRM, V.VERIFIED),
    VTransition(V.SENT, VA.CONFIRM, V.VERIFIED),
    VTransition(V.SEND_FAILED, VA.CONFIRM, V.VERIFIED),
    *(VTransition(state, VA.EXPIRE, V.EXPIRED) for state in UNFINISHED),
)

# At most one of these per (tenant, email): enforced by a (partial) unique index.
ACTIVE: frozenset[VState] = frozenset({V.CREATED, V.SEND_PENDING, V.SENT})
FINAL: frozenset[VState] = frozenset({V.VERIFIED, V.EXPIRED})
MAX_CONFIRM_ATTEMPTS = 5

# How an outbox message's new state moves the verification that sent it.
FOLLOWS: dict[Status, VAction] = {
    Status.SENT: VA.MESSAGE_SENT,
    Status.FAILED: VA.MESSAGE_FAILED,
    Status.DEAD: VA.MESSAGE_FAILED,
    Status.PENDING: VA.MESSAGE_REQUEUED,
}


def v_sources(action: VAction) -> frozenset[VState]:
    return frozenset(t.source for t in V_TRANSITIONS if t.action is action and t.source)


def v_target(action: VAction) -> VState:
    (only,) = {t.target for t in V_TRANSITIONS if t.action is action}
    return only


def v_can_move(source: VState | None, target: VState) -> bool:
    return any(t.source == source and t.target == target for t in V_TRANSITIONS)


def new_token() -> str:
    """A 256-bit secret for the email; only its digest is stored."""
    return secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    # The secrets are random and long, so a fast hash is enough: nothing to brute-force.
    return hashlib.sha256(secret.encode()).hexdigest()


def matches(secret: str, stored_digest: str) -> bool:
    return hmac.compare_digest(digest(secret), stored_digest)
