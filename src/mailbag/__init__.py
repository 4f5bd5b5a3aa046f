"""mailbag: transactional email through an outbox, sent once by any number of workers."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mailbag.domain.content import Address, Attachment, Limits, Priority
    from mailbag.domain.message import (
        InvalidMessage,
        Message,
        MessageTooLarge,
        NewMessage,
        new_message,
    )
    from mailbag.domain.states import Status
    from mailbag.services.intake import enqueue, enqueue_async, enqueue_many, enqueue_many_async

# Imported on first use, so `import mailbag.cli` (the command line) starts without SQLAlchemy.
# A name maps to the module it is defined in.
_EXPORTS: dict[str, str] = {
    "Address": "mailbag.domain.content",
    "Attachment": "mailbag.domain.content",
    "Limits": "mailbag.domain.content",
    "Priority": "mailbag.domain.content",
    "MessageTooLarge": "mailbag.domain.message",
    "InvalidMessage": "mailbag.domain.message",
    "Message": "mailbag.domain.message",
    "NewMessage": "mailbag.domain.message",
    "Status": "mailbag.domain.states",
    "new_message": "mailbag.domain.message",
    # The doors that check each message under the deployment's rules (services.intake).
    "enqueue": "mailbag.services.intake",
    "enqueue_async": "mailbag.services.intake",
    "enqueue_many": "mailbag.services.intake",
    "enqueue_many_async": "mailbag.services.intake",
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
