"""What operators (console, admin API, CLI) and evidence do to messages: requeue, cancel,
resolve, flag, purge. Each is a guarded transition with its event, like the worker's."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, exists, select

from mailbag.domain import states
from mailbag.domain.message import Filter, Message, truncate_error
from mailbag.domain.states import Action, Status
from mailbag.store.dispatch import claim_order
from mailbag.store.message_transitions import (
    CLAIM_CLEARED,
    MESSAGE_ROWS,
    Changed,
    message_from_row,
    om,
    transition,
)
from mailbag.store.messages import matching
from mailbag.store.plan import Plan, Step
from mailbag.store.schema import message_attachments, message_events
from mailbag.store.transition import EventSpec


def requeue(
    *,
    where: Filter,
    now: datetime,
    actor: str,
    extra_attempts: int,
    limit: int | None = None,
) -> Plan[list[Changed[Message]]]:
    """Send `unknown` or `dead` messages again, with a fresh attempt budget.

    Attempt numbers keep counting (they name provider idempotency keys, which must not be
    reused for a deliberate resend), so the budget grows instead: max = done + extra.
    """
    return (
        yield from transition(
            Action.REQUEUE,
            as_row=message_from_row,
            where=matching(where),
            values={
                "next_attempt_at": now,
                "claim_order_at": claim_order(now),
                "max_attempts": om.c.attempt_count + extra_attempts,
                "ambiguous_since": None,
                **CLAIM_CLEARED,
            },
            now=now,
            actor=actor,
            order_by=(om.c.id,),
            limit=limit,
            event=EventSpec(text="requeued by an operator"),
        )
    )


def cancel(*, where: Filter, now: datetime, actor: str) -> Plan[list[Changed[Message]]]:
    """Withdraw pending messages (never one a worker holds or already tried)."""
    return (
        yield from transition(
            Action.CANCEL,
            as_row=message_from_row,
            where=matching(where),
            now=now,
            actor=actor,
            event=EventSpec(text="cancelled"),
        )
    )


def resolve(
    *,
    message_id: uuid.UUID,
    sent: bool,
    now: datetime,
    actor: str,
    evidence: str,
    provider_message_id: str | None = None,
) -> Plan[list[Changed[Message]]]:
    """Settle an `unknown` message from evidence: it was accepted (sent) or it was not (failed)."""
    values: dict[str, Any] = {"ambiguous_since": None}
    if sent:
        values["sent_at"] = now
        if provider_message_id:
            values["provider_message_id"] = provider_message_id
    else:
        values["last_error"] = truncate_error(evidence)
    return (
        yield from transition(
            Action.RESOLVE_SENT if sent else Action.RESOLVE_FAILED,
            as_row=message_from_row,
            where=om.c.id == message_id,
            values=values,
            now=now,
            actor=actor,
            event=EventSpec(text=evidence),
        )
    )


def flag(
    *, message_id: uuid.UUID, now: datetime, actor: str, detail: str
) -> Plan[list[Changed[Message]]]:
    """Mark an unknown message as waiting for an operator, once per stay in `unknown`.

    Not a change of state (unknown stays unknown) but an event the console and alerts can
    see; a message flagged since it last changed is not flagged again."""
    flagged_since_last_change = exists().where(
        message_events.c.message_id == om.c.id,
        message_events.c.from_status == Status.UNKNOWN.value,
        message_events.c.to_status == Status.UNKNOWN.value,
        message_events.c.at >= om.c.updated_at,
    )
    return (
        yield from transition(
            Action.FLAG,
            as_row=message_from_row,
            where=and_(om.c.id == message_id, ~flagged_since_last_change),
            values={},
            now=now,
            actor=actor,
            event=EventSpec(text=detail),
        )
    )


def purge(
    *,
    older_than: datetime,
    limit: int = 1000,
    tenant_id: str | None = None,
    other_than: Collection[str] = (),
) -> Plan[int]:
    """Delete up to `limit` terminal messages (their events and attachment references too)
    last changed before a cutoff: of one tenant (`tenant_id`), or of every tenant but those
    `other_than` names (the tenants that keep their own PURGE_AFTER_DAYS).

    Callers repeat it until it returns less than `limit`, one short transaction per chunk, so
    a large purge never holds locks for long. `unknown` messages are never purged.
    """
    # Exactly the predicate of the finished rows' index (migration 0012; MariaDB: (updated_at,
    # status)): each chunk reads the oldest `limit` of them in order, never sorting them all.
    old = and_(MESSAGE_ROWS.in_states(states.TERMINAL), om.c.updated_at < older_than)
    if tenant_id is not None:
        old = and_(old, om.c.tenant_id == tenant_id)
    if other_than:
        old = and_(old, om.c.tenant_id.not_in(sorted(other_than)))
    oldest = select(om.c.id).where(old).order_by(om.c.updated_at).limit(limit)
    ids = (yield Step(oldest)).scalars().all()
    if not ids:
        return 0
    yield Step(delete(message_events).where(message_events.c.message_id.in_(ids)))
    # Their attachments' bytes stay until attachments.purge_unreferenced finds them unused.
    yield Step(delete(message_attachments).where(message_attachments.c.message_id.in_(ids)))
    result = yield Step(delete(om).where(om.c.id.in_(ids), old))
    return int(result.rowcount)  # type: ignore[attr-defined]
