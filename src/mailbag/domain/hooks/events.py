"""The events a tenant can subscribe to, and which message change or provider event is
which. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from mailbag.domain.events import EventKind
from mailbag.domain.states import Status


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
