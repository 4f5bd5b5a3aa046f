"""The pure core: states, transitions, retry policy and validation. No I/O happens here."""

from mailbag.domain.message import InvalidMessage, Message, NewMessage, new_message
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.states import CLAIMABLE, TERMINAL, TRANSITIONS, Action, Status

__all__ = [
    "CLAIMABLE",
    "TERMINAL",
    "TRANSITIONS",
    "Action",
    "InvalidMessage",
    "Message",
    "NewMessage",
    "RetryPolicy",
    "Status",
    "new_message",
]
