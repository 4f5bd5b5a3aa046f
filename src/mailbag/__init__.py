"""mailbag: transactional email through an outbox, sent once by any number of workers."""

from mailbag.domain import InvalidMessage, Message, NewMessage, Status, new_message
from mailbag.services.outbox import enqueue, enqueue_async, enqueue_many, enqueue_many_async

__all__ = [
    "InvalidMessage",
    "Message",
    "NewMessage",
    "Status",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "new_message",
]
