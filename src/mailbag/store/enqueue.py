"""Enqueue: new messages enter the outbox, idempotently by (tenant, key), inside the
caller's transaction."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    func,
    select,
)

from mailbag.domain.ids import uuid7
from mailbag.domain.message import Message, NewMessage
from mailbag.domain.states import MESSAGES, Action
from mailbag.store import suppressions as suppression_store
from mailbag.store.message_transitions import LAST_ERROR, MESSAGE_ROWS, message_from_row, om
from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.transition import history_row, record
from mailbag.store.types import insert_unless_taken

NOTIFY_CHANNEL = "mailbag_outbox"


@dataclass(frozen=True)
class Enqueued:
    message: Message
    created: bool  # False: the idempotency key was taken; `message` is the one already there


def enqueue(
    messages: Sequence[NewMessage],
    *,
    now: datetime,
    default_max_attempts: int,
    actor: str = "api",
) -> Plan[list[Enqueued]]:
    """Insert messages, idempotently by (tenant, key), without ever aborting the transaction.

    A taken key is skipped by the database (ON CONFLICT DO NOTHING / ON DUPLICATE KEY) rather
    than raised and caught, so the caller's transaction stays usable; the message that holds
    the key is read back and returned with `created=False`. Messages to an address on the
    tenant's suppression list are written as `failed` at once, never offered to a provider.
    """
    if not messages:
        return []
    dialect = yield from current_dialect()
    suppressed = yield from suppression_store.among((m.tenant_id, m.to_address) for m in messages)
    rows = [
        _new_row(m, now, default_max_attempts, (m.tenant_id, m.to_address.lower()) in suppressed)
        for m in messages
    ]
    taken_keys = insert_unless_taken(dialect, om, (om.c.tenant_id, om.c.idempotency_key))
    yield Step(taken_keys, rows)

    taken_by: dict[tuple[str, str], Message] = {}
    keys_by_tenant: dict[str, list[str]] = defaultdict(list)
    for m in messages:
        if m.idempotency_key is not None:
            keys_by_tenant[m.tenant_id].append(m.idempotency_key)
    for tenant_id, keys in keys_by_tenant.items():
        lookup = select(om).where(om.c.tenant_id == tenant_id, om.c.idempotency_key.in_(keys))
        if dialect == "mysql":
            # A locking read sees the row a concurrent enqueue committed, whatever the
            # caller's isolation level and snapshot.
            lookup = lookup.with_for_update(read=True)
        for row in (yield Step(lookup)).all():
            taken_by[(row.tenant_id, row.idempotency_key)] = message_from_row(row)

    results: list[Enqueued] = []
    for m, new_row in zip(messages, rows, strict=True):
        holder = taken_by.get((m.tenant_id, m.idempotency_key)) if m.idempotency_key else None
        if holder is not None and holder.id != new_row["id"]:
            results.append(Enqueued(holder, created=False))
        else:
            results.append(Enqueued(Message(**new_row), created=True))
    # Within one call the same key may appear twice: only its first row was inserted.
    seen: set[uuid.UUID] = set()
    created = []
    for result in results:
        if result.created and result.message.id not in seen:
            seen.add(result.message.id)
            created.append(result.message)
    if created:
        yield from record(
            MESSAGE_ROWS,
            [
                history_row(MESSAGE_ROWS, vars(m), None, at=now, actor=actor, event=LAST_ERROR)
                for m in created
            ],
        )
        if dialect == "postgresql":
            # Delivered at commit, so idle workers wake exactly when the rows become visible.
            yield Step(select(func.pg_notify(NOTIFY_CHANNEL, "")))
    return results


def _new_row(
    m: NewMessage, now: datetime, default_max_attempts: int, suppressed: bool
) -> dict[str, Any]:
    return {
        "id": uuid7(),
        "tenant_id": m.tenant_id,
        "idempotency_key": m.idempotency_key,
        "to_address": m.to_address,
        "to_name": m.to_name,
        "from_address": m.from_address,
        "subject": m.subject,
        "template_name": m.template_name,
        "template_data": dict(m.template_data),
        "headers": dict(m.headers),
        "tags": list(m.tags),
        "metadata": dict(m.metadata),
        "status": MESSAGES.target(Action.SUPPRESS if suppressed else Action.ENQUEUE).value,
        "attempt_count": 0,
        "max_attempts": m.max_attempts or default_max_attempts,
        "next_attempt_at": m.send_at or now,
        "created_at": now,
        "updated_at": now,
        "claim_token": None,
        "claimed_by": None,
        "claimed_at": None,
        "lease_expires_at": None,
        "provider": None,
        "provider_message_id": None,
        "last_error": "suppressed" if suppressed else None,
        "sent_at": None,
        "ambiguous_since": None,
    }
