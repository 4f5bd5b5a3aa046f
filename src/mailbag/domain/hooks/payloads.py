"""What a receiver gets: a payload says what happened to a message, never what it said
(no template data, bodies, headers or secrets). Pure: no I/O."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mailbag.domain.hooks.events import HookEvent

ERROR_MAX = 1000


@dataclass(frozen=True)
class MessageFacts:
    """What a payload may say about a message: its state and the provider's answer, never
    its content."""

    message_id: uuid.UUID
    tenant_id: str
    status: str
    to: str | None = None
    template: str | None = None
    subject: str | None = None
    provider_message_id: str | None = None
    error: str | None = None
    metadata: Mapping[str, Any] | None = None
    # From a provider's event:
    recipient: str | None = None
    bounce_type: str | None = None
    detail: str | None = None  # bounce diagnostic, clicked link ...
    provider: str | None = None


def payload(event: HookEvent, facts: MessageFacts, occurred_at: datetime) -> str:
    """The JSON body of a delivery: `{"type", "timestamp", "data"}` (Standard Webhooks'
    recommended shape). Keys with no value are left out, so a payload stays small."""
    data: dict[str, Any] = {
        "message_id": str(facts.message_id),
        "tenant_id": facts.tenant_id,
        "status": facts.status,
        "to": facts.to,
        "template": facts.template,
        "subject": facts.subject,
        "provider": facts.provider,
        "provider_message_id": facts.provider_message_id,
        "error": facts.error[:ERROR_MAX] if facts.error else None,
        "recipient": facts.recipient,
        "bounce_type": facts.bounce_type,
        "detail": facts.detail[:ERROR_MAX] if facts.detail else None,
        "metadata": dict(facts.metadata) if facts.metadata else None,
    }
    body = {
        "type": event.value,
        "timestamp": occurred_at.isoformat().replace("+00:00", "Z"),
        "data": {key: value for key, value in data.items() if value is not None},
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str)
