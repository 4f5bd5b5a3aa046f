"""mailbag: transactional email through an outbox, sent once by any number of workers."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mailbag.domain import InvalidMessage, Message, NewMessage, Status, new_message
    from mailbag.domain.content import Address, Attachment, Limits, Priority
    from mailbag.domain.message import MessageTooLarge
    from mailbag.services.outbox import enqueue, enqueue_async, enqueue_many, enqueue_many_async

# Imported on first use, so `import mailbag.cli` (the command line) starts without SQLAlchemy.
_EXPORTS = {
    "Address": "mailbag.domain.content",
    "Attachment": "mailbag.domain.content",
    "Limits": "mailbag.domain.content",
    "Priority": "mailbag.domain.content",
    "MessageTooLarge": "mailbag.domain.message",
    "InvalidMessage": "mailbag.domain",
    "Message": "mailbag.domain",
    "NewMessage": "mailbag.domain",
    "Status": "mailbag.domain",
    "new_message": "mailbag.domain",
    "enqueue": "mailbag.services.outbox",
    "enqueue_async": "mailbag.services.outbox",
    "enqueue_many": "mailbag.services.outbox",
    "enqueue_many_async": "mailbag.services.outbox",
}


__all__ = [
    "Address",
    "Attachment",
    "InvalidMessage",
    "Limits",
    "Message",
    "MessageTooLarge",
    "NewMessage",
    "Priority",
    "Status",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "new_message",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mailbag' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
