"""Enqueue: new messages enter the outbox, idempotently by (tenant, key), inside the
caller's transaction."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select

from mailbag.domain.content import Attachment, head_start
from mailbag.domain.hooks import HookEvent
from mailbag.domain.ids import uuid7
from mailbag.domain.message import InvalidMessage, Message, NewMessage
from mailbag.domain.states import MESSAGES, Action, Status
from mailbag.store import attachments as attachment_store
from mailbag.store import hooks
from mailbag.store import senders as sender_store
from mailbag.store import suppressions as suppression_store
from mailbag.store.bulk_insert import insert_rows
from mailbag.store.message_transitions import (
    LAST_ERROR,
    MESSAGE_ROWS,
    carried_json,
    message_facts,
    message_from_row,
    om,
    unpacked,
)
from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.transition import history_row, record
from mailbag.store.types import one_of

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
    the key is read back and returned with `created=False`. Every recipient is checked
    against the tenant's suppression list: suppressed ones are dropped and listed in
    `suppressed`, and a message with no To left is written as `failed` at once, never offered
    to a provider. An explicit `from` must be a sender identity of the message's tenant
    (InvalidMessage otherwise, before anything is written). Attachments are written for the
    messages created here only: a replayed key writes nothing new.
    """
    if not messages:
        return []
    dialect = yield from current_dialect()
    identities = yield from _check_senders(messages)
    suppressed = yield from suppression_store.among(
        (m.tenant_id, a.address) for m in messages for a in m.recipients
    )
    rows = [
        _new_row(m, now, default_max_attempts, suppressed, identities.get(_sender(m)))
        for m in messages
    ]
    yield insert_rows(dialect, om, rows, unless_taken=(om.c.tenant_id, om.c.idempotency_key))
    keyed = [(m, row["id"]) for m, row in zip(messages, rows, strict=True) if m.idempotency_key]
    written = (yield from _ours(dialect, [new_id for _, new_id in keyed])) if keyed else set()
    taken_by = yield from _holders(dialect, [m for m, new_id in keyed if new_id not in written])
    results: list[Enqueued] = []
    for m, new_row in zip(messages, rows, strict=True):
        holder = taken_by.get((m.tenant_id, m.idempotency_key)) if m.idempotency_key else None
        if holder is not None and holder.id != new_row["id"]:
            results.append(Enqueued(holder, created=False))
        else:
            results.append(Enqueued(_message(new_row, m), created=True))
    if holders := [r.message for r in results if not r.created]:
        found = {m.id: m for m in (yield from attachment_store.attached(holders))}
        results = [r if r.created else Enqueued(found[r.message.id], False) for r in results]
    yield from _record_created(dialect, messages, results, now=now, actor=actor)
    return results


def _ours(dialect: str, new_ids: list[uuid.UUID]) -> Plan[set[uuid.UUID]]:
    """Which keyed rows are ours, by primary key: only a key that was taken is then read
    back by (tenant, key) (none on a first send), a lookup PostgreSQL plans as a scan of all
    the tenant's rows while the table is new to its statistics."""
    mine = select(om.c.id).where(one_of(dialect, om.c.id, new_ids, "new_ids"))
    return set((yield Step(mine)).scalars().all())


def _holders(dialect: str, skipped: list[NewMessage]) -> Plan[dict[tuple[str, str], Message]]:
    """The messages holding the keys these messages found taken, by (tenant, key)."""
    keys_by_tenant: dict[str, list[str]] = defaultdict(list)
    for m in skipped:
        keys_by_tenant[m.tenant_id].append(m.idempotency_key)  # type: ignore[arg-type]
    taken_by: dict[tuple[str, str], Message] = {}
    for tenant_id, keys in keys_by_tenant.items():
        lookup = select(om).where(om.c.tenant_id == tenant_id, om.c.idempotency_key.in_(keys))
        if dialect == "mysql":
            # A locking read sees the row a concurrent enqueue committed, whatever the
            # caller's isolation level and snapshot.
            lookup = lookup.with_for_update(read=True)
        for row in (yield Step(lookup)).all():
            taken_by[(row.tenant_id, row.idempotency_key)] = message_from_row(row)
    return taken_by


def _record_created(
    dialect: str,
    messages: Sequence[NewMessage],
    results: list[Enqueued],
    *,
    now: datetime,
    actor: str,
) -> Plan[None]:
    """What the messages created here add: their attachments, their history rows, the
    hooks of those born failed, and (PostgreSQL) the workers' NOTIFY."""
    # Within one call the same key may appear twice: only its first row was inserted.
    seen: set[uuid.UUID] = set()
    created = []
    carried: dict[uuid.UUID, tuple[Attachment, ...]] = {}
    for m, result in zip(messages, results, strict=True):
        if result.created and result.message.id not in seen:
            seen.add(result.message.id)
            created.append(result.message)
            if m.attachments:
                carried[result.message.id] = m.attachments
    if carried:
        yield from attachment_store.store(carried, now=now)
    if not created:
        return
    yield from record(
        MESSAGE_ROWS,
        [
            history_row(MESSAGE_ROWS, vars(m), None, at=now, actor=actor, event=LAST_ERROR)
            for m in created
        ],
    )
    # A message whose every To is suppressed is born failed: its hook fires now.
    if failed := [m for m in created if m.status == Status.FAILED]:
        yield from hooks.fan_out([(HookEvent.FAILED, m) for m in failed], message_facts, now=now)
    if dialect == "postgresql":
        # Delivered at commit, so idle workers wake exactly when the rows become visible.
        yield Step(select(func.pg_notify(NOTIFY_CHANNEL, "")))


def _sender(m: NewMessage) -> tuple[str, str]:
    return (m.tenant_id, (m.from_address or "").lower())


def _check_senders(
    messages: Sequence[NewMessage],
) -> Plan[dict[tuple[str, str], str | None]]:
    """The sender identities the messages' explicit `from`s name (by tenant and lower-case
    address, with their names); InvalidMessage when one is not its tenant's, before anything
    is written."""
    wanted = {_sender(m) for m in messages if m.from_address is not None}
    if not wanted:
        return {}
    identities = yield from sender_store.owned(wanted)
    for m in messages:
        if m.from_address is not None and _sender(m) not in identities:
            raise InvalidMessage(
                {
                    "from": (
                        f"{m.from_address} is not a sender identity of tenant {m.tenant_id}; "
                        f"add it with `mailbag tenants senders add {m.tenant_id} "
                        f"{m.from_address}`"
                    )
                }
            )
    return identities


def _message(row: dict[str, Any], m: NewMessage) -> Message:
    """The Message a created row is (`carried` unpacked into its fields)."""
    columns = {key: value for key, value in row.items() if key != "carried"}
    return Message(
        **columns, **unpacked(row["carried"] or {}), attachments=tuple(a.ref for a in m.attachments)
    )


def _new_row(
    m: NewMessage,
    now: datetime,
    default_max_attempts: int,
    suppressed: frozenset[tuple[str, str]],
    sender_name: str | None,
) -> dict[str, Any]:
    dropped = {
        a.address.lower() for a in m.recipients if (m.tenant_id, a.address.lower()) in suppressed
    }
    recipients = m.recipients.without(dropped) if dropped else m.recipients
    failed = not recipients.to  # copies alone are not sent
    if failed:
        recipients = m.recipients
    first = recipients.to[0]
    next_attempt_at = m.send_at or now
    return {
        "id": uuid7(),
        "tenant_id": m.tenant_id,
        "idempotency_key": m.idempotency_key,
        "to_address": first.address,
        "to_name": first.name,
        "from_address": m.from_address,
        "subject": m.subject,
        "template_name": m.template_name,
        "template_data": dict(m.template_data),
        "headers": dict(m.headers),
        "tags": list(m.tags),
        "metadata": dict(m.metadata),
        "status": MESSAGES.target(Action.SUPPRESS if failed else Action.ENQUEUE).value,
        "attempt_count": 0,
        "max_attempts": m.max_attempts or default_max_attempts,
        "next_attempt_at": next_attempt_at,
        "created_at": now,
        "updated_at": now,
        "claim_token": None,
        "claimed_by": None,
        "claimed_at": None,
        "lease_expires_at": None,
        "provider": None,
        "provider_message_id": None,
        "last_error": "suppressed" if failed else None,
        "sent_at": None,
        "ambiguous_since": None,
        # The common case (one To, a template) writes NULL here.
        "carried": carried_json(
            m,
            recipients,
            [a.address for a in m.recipients if a.address.lower() in dropped],
            m.from_name or (sender_name if m.from_address else None),
        ),
        "expires_at": m.expires_at,
        "priority": int(m.priority),
        "claim_order_at": next_attempt_at - head_start(m.priority),
        "attachment_count": len(m.attachments),
        "bulk": m.bulk,
        "template_version_id": m.pin.version_id if m.pin else None,
        "template_version": m.pin.version if m.pin else None,
        "template_locale": m.pin.locale if m.pin else None,
    }


def first_use_row(m: NewMessage, now: datetime, default_max_attempts: int) -> dict[str, Any]:
    """The row a key's first use writes (store/first_use.py): as `enqueue` would, nobody
    suppressed (its chain checks that), and no sender identity (it takes no explicit
    `from`)."""
    return _new_row(m, now, default_max_attempts, frozenset(), None)


def first_use_message(row: dict[str, Any], m: NewMessage) -> Message:
    return _message(row, m)


# What a first use writes of a message: every column but those a new message leaves NULL
# (claim, lease, provider, sending) and `from_address` (a first use has none).
FIRST_USE_COLUMNS = (
    "id",
    "tenant_id",
    "idempotency_key",
    "to_address",
    "to_name",
    "subject",
    "template_name",
    "template_data",
    "headers",
    "tags",
    "metadata",
    "status",
    "attempt_count",
    "max_attempts",
    "next_attempt_at",
    "created_at",
    "updated_at",
    "last_error",
    "carried",
    "expires_at",
    "priority",
    "claim_order_at",
    "attachment_count",
    "bulk",
    "template_version_id",
    "template_version",
    "template_locale",
)
