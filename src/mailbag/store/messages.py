"""Reads of outbox messages and their history."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Row,
    func,
    select,
)

from mailbag.domain.message import Message
from mailbag.domain.states import Status
from mailbag.store.message_transitions import message_from_row, om
from mailbag.store.plan import Plan, Step
from mailbag.store.schema import message_events


def get(message_id: uuid.UUID, tenant_id: str | None = None) -> Plan[Message | None]:
    query = select(om).where(om.c.id == message_id)
    if tenant_id is not None:
        query = query.where(om.c.tenant_id == tenant_id)
    row = (yield Step(query)).first()
    return message_from_row(row) if row else None


def page(
    *,
    tenant_id: str | None,
    limit: int,
    status: Status | None = None,
    to: str | None = None,
    template: str | None = None,
    before: uuid.UUID | None = None,
    created_from: datetime | None = None,
    created_to: datetime | None = None,
) -> Plan[tuple[list[Message], bool]]:
    """Newest first (ids are time-ordered), up to `limit`, and whether more follow."""
    filters = {
        om.c.tenant_id: tenant_id,
        om.c.status: status,
        # Local parts are case-sensitive by the RFC but not by any mailbox anyone uses.
        func.lower(om.c.to_address): to.lower() if to else None,
        om.c.template_name: template,
    }
    query = select(om).where(
        *(column == value for column, value in filters.items() if value is not None)
    )
    if before is not None:
        query = query.where(om.c.id < before)
    if created_from is not None:
        query = query.where(om.c.created_at >= created_from)
    if created_to is not None:
        query = query.where(om.c.created_at < created_to)
    rows = (yield Step(query.order_by(om.c.id.desc()).limit(limit + 1))).all()
    return [message_from_row(row) for row in rows[:limit]], len(rows) > limit


def events(message_id: uuid.UUID) -> Plan[list[Row[Any]]]:
    query = (
        select(message_events)
        .where(message_events.c.message_id == message_id)
        .order_by(message_events.c.id)
    )
    return list((yield Step(query)).all())


def count_by_status() -> Plan[dict[str, int]]:
    query = select(om.c.status, func.count().label("n")).group_by(om.c.status)
    return {row.status: int(row.n) for row in (yield Step(query)).all()}
