"""The pure core: states, transitions, retry policy and validation. No I/O happens here."""

from mailbag.domain.content import Address, Attachment, Limits, Priority
from mailbag.domain.message import InvalidMessage, Message, MessageTooLarge, NewMessage, new_message
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.states import CLAIMABLE, TERMINAL, TRANSITIONS, Action, Status

__all__ = [
    "CLAIMABLE",
    "TERMINAL",
    "TRANSITIONS",
    "Action",
    "Address",
    "Attachment",
    "InvalidMessage",
    "Limits",
    "Message",
    "MessageTooLarge",
    "NewMessage",
    "Priority",
    "RetryPolicy",
    "Status",
    "new_message",
]
