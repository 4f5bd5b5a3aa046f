"""Provider events: stored once each (providers resend), matched to our messages; an event
about one of our messages fires its event hook in the same transaction (hooks.fan_out)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, or_, select

from mailbag.domain.events import ProviderEvent
from mailbag.domain.hooks import FOR_PROVIDER_EVENT, MessageFacts
from mailbag.domain.message import Message
from mailbag.store import hooks, messages
from mailbag.store.message_transitions import message_facts, message_from_row
from mailbag.store.plan import Plan, Step
from mailbag.store.schema import outbox_messages as om
from mailbag.store.schema import provider_events as pe


@dataclass(frozen=True)
class StoredEvent:
    id: int
    provider: str
    kind: str
    bounce_type: str | None
    provider_event: str
    occurred_at: datetime
    received_at: datetime
    provider_message_id: str | None
    message_id: uuid.UUID | None
    tenant_id: str | None
    recipient: str | None
    detail: str | None


_FIELDS = tuple(StoredEvent.__dataclass_fields__)


def _stored(values: Any) -> StoredEvent:
    return StoredEvent(**{name: values[name] for name in _FIELDS})


def match(event: ProviderEvent) -> Plan[Message | None]:
    """Our message for an event: by our id carried in a header or tag, else by the
    provider's id recorded when it accepted the message."""
    if event.message_id is not None:
        found = yield from messages.get(event.message_id)
        if found is not None:
            return found
    if event.provider_message_id:
        row = (
            yield Step(
                select(om).where(om.c.provider_message_id == event.provider_message_id).limit(1)
            )
        ).first()
        if row is not None:
            return message_from_row(row)
    return None


def store(
    event: ProviderEvent, *, message: Message | None, now: datetime
) -> Plan[StoredEvent | None]:
    """Keep the event (raw payload too); None if it was stored before (a resend)."""
    seen = (yield Step(select(pe.c.id).where(pe.c.dedup_key == event.dedup_key))).first()
    if seen is not None:
        return None
    values = {
        "provider": event.provider,
        "dedup_key": event.dedup_key,
        "kind": event.kind.value,
        "bounce_type": event.bounce_type.value if event.bounce_type else None,
        "provider_event": event.provider_event[:50],
        "occurred_at": event.occurred_at,
        "received_at": now,
        "provider_message_id": (event.provider_message_id or None),
        "message_id": message.id if message else None,
        "tenant_id": message.tenant_id if message else None,
        "recipient": event.recipient,
        "detail": (event.detail or "")[:2000] or None,
        "raw": dict(event.raw),
    }
    result = yield Step(insert(pe).values(values))
    hook_event = FOR_PROVIDER_EVENT.get(event.kind)
    if message is not None and hook_event is not None:

        def facts(message: Message) -> MessageFacts:
            return replace(
                message_facts(message),
                recipient=event.recipient,
                bounce_type=event.bounce_type.value if event.bounce_type else None,
                detail=event.detail,
                provider=event.provider,
            )

        yield from hooks.fan_out(
            [(hook_event, message)], facts, now=now, occurred_at=event.occurred_at
        )
    return _stored({**values, "id": result.inserted_primary_key[0]})  # type: ignore[attr-defined]


def for_message(message: Message) -> Plan[list[StoredEvent]]:
    """Every event about one message, oldest first."""
    conditions = [pe.c.message_id == message.id]
    if message.provider_message_id:
        conditions.append(pe.c.provider_message_id == message.provider_message_id)
    rows = (
        yield Step(select(pe).where(or_(*conditions)).order_by(pe.c.occurred_at, pe.c.id))
    ).all()
    return [_stored(row._mapping) for row in rows]


def unmatched_count() -> Plan[int]:
    query = select(func.count()).select_from(pe).where(pe.c.message_id.is_(None))
    return int((yield Step(query)).scalar_one())
