"""Transitional re-exports while issue 10's helpers move their callers to the modules that
split this one (message_transitions, enqueue, dispatch, operator, messages). Removed before
the issue closes."""

from mailbag.store.dispatch import (
    FINALIZE_ACTIONS,
    LEASE_EXPIRED,
    Claim,
    Finalized,
    claim,
    expired_before,
    extend_lease,
    finalize,
    sweep_expired,
)
from mailbag.store.enqueue import NOTIFY_CHANNEL, Enqueued, enqueue
from mailbag.store.message_transitions import (
    SETTLED_COLUMNS,
    Changed,
    Settled,
    message_from_row,
    om,
)
from mailbag.store.messages import count_by_status, events, get, page
from mailbag.store.operator import cancel, flag, purge, requeue, resolve

__all__ = [
    "FINALIZE_ACTIONS",
    "LEASE_EXPIRED",
    "NOTIFY_CHANNEL",
    "SETTLED_COLUMNS",
    "Changed",
    "Claim",
    "Enqueued",
    "Finalized",
    "Settled",
    "cancel",
    "claim",
    "count_by_status",
    "enqueue",
    "events",
    "expired_before",
    "extend_lease",
    "finalize",
    "flag",
    "get",
    "message_from_row",
    "om",
    "page",
    "purge",
    "requeue",
    "resolve",
    "sweep_expired",
]
