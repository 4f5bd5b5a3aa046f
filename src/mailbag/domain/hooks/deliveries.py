"""One event for one endpoint, delivered through an outbox of its own: its states and
moves (`DELIVERIES`, a `Machine` as for messages), what a delivery and each of its moves
hold, and when an endpoint that keeps failing waits (`Breaker`). Pure: no I/O."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from mailbag.domain.hooks.events import HookEvent
from mailbag.domain.machine import Budget, Counted, Machine, Transition, from_each


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
    EXPIRE = "expire"  # the lease ran out (a worker died mid-POST): an attempt spent
    RELEASE = "release"  # handed back without a POST (shutdown, endpoint disabled)
    REPLAY = "replay"  # an operator sends it again, same webhook-id


_D, _A = DState, DAction
_NEVER_TRIED, _TRIED = Counted("attempts", positive=False), Counted("attempts", True)
_LAST_ATTEMPT = Budget("attempts", "max_attempts", spent=True)
_ATTEMPTS_LEFT = Budget("attempts", "max_attempts", spent=False)
DELIVERY_TRANSITIONS: tuple[Transition[DState, DAction], ...] = (
    Transition(None, _A.CREATE, _D.PENDING),
    *from_each((_D.PENDING, _D.RETRYING), _A.CLAIM, _D.PROCESSING),
    Transition(_D.PROCESSING, _A.DELIVER, _D.DELIVERED),
    Transition(_D.PROCESSING, _A.RETRY, _D.RETRYING),
    Transition(_D.PROCESSING, _A.BURY, _D.DEAD),
    # A POST may have reached the receiver before the worker died: at least once, so retry;
    # but the attempt counts, so a delivery that kills its worker every time ends dead.
    Transition(_D.PROCESSING, _A.EXPIRE, _D.RETRYING, when=_ATTEMPTS_LEFT),
    Transition(_D.PROCESSING, _A.EXPIRE, _D.DEAD, when=_LAST_ATTEMPT),
    Transition(_D.PROCESSING, _A.RELEASE, _D.PENDING, when=_NEVER_TRIED),
    Transition(_D.PROCESSING, _A.RELEASE, _D.RETRYING, when=_TRIED),
    *from_each((_D.DELIVERED, _D.DEAD), _A.REPLAY, _D.PENDING),
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

    @property
    def attempts_shown(self) -> str:
        """What operators read (console, CLI): `3 made, 5 left`. Not `3/8`: a replay adds
        a fresh budget on top of the attempts made (max = made + HOOK_MAX_ATTEMPTS), so a
        replayed delivery read `2/9` after one new attempt."""
        if self.status in (DState.DELIVERED, DState.DEAD):
            return f"{self.attempts} made"
        return f"{self.attempts} made, {max(self.max_attempts - self.attempts, 0)} left"


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
