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
    ARRAY,
    Integer,
    String,
    Uuid,
    any_,
    bindparam,
    func,
    select,
    text,
)

from mailbag.domain.content import Attachment, head_start
from mailbag.domain.hooks import HookEvent
from mailbag.domain.ids import uuid7
from mailbag.domain.message import InvalidMessage, Message, NewMessage
from mailbag.domain.states import MESSAGES, Action, Status
from mailbag.store import attachments as attachment_store
from mailbag.store import hooks
from mailbag.store import senders as sender_store
from mailbag.store import suppressions as suppression_store
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
from mailbag.store.schema import idempotency_records, message_events, suppressions
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
    taken_keys = insert_unless_taken(dialect, om, (om.c.tenant_id, om.c.idempotency_key))
    yield Step(taken_keys, rows)
    keyed = [(m, row["id"]) for m, row in zip(messages, rows, strict=True) if m.idempotency_key]
    written: set[uuid.UUID] = set()
    if keyed:
        # Which keyed rows are ours, by primary key: only a key that was taken is then read
        # back by (tenant, key) (none on a first send), a lookup PostgreSQL plans as a scan
        # of all the tenant's rows while the table is new to its statistics.
        new_ids = [new_id for _, new_id in keyed]
        if dialect == "postgresql":
            # One array parameter, not 1,000: one statement, prepared once, read by the index
            # (a long IN list went on being planned as a scan comparing every row with it).
            ids = bindparam("new_ids", new_ids, type_=ARRAY(Uuid))
            mine = select(om.c.id).where(om.c.id == any_(ids))
        else:
            mine = select(om.c.id).where(om.c.id.in_(new_ids))
        written = set((yield Step(mine)).scalars().all())

    taken_by: dict[tuple[str, str], Message] = {}
    keys_by_tenant: dict[str, list[str]] = defaultdict(list)
    for m, new_id in keyed:
        if new_id not in written:
            keys_by_tenant[m.tenant_id].append(m.idempotency_key)  # type: ignore[arg-type]
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
            results.append(Enqueued(_message(new_row, m), created=True))
    if holders := [r.message for r in results if not r.created]:
        found = {m.id: m for m in (yield from attachment_store.attached(holders))}
        results = [r if r.created else Enqueued(found[r.message.id], False) for r in results]
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
    if created:
        yield from record(
            MESSAGE_ROWS,
            [
                history_row(MESSAGE_ROWS, vars(m), None, at=now, actor=actor, event=LAST_ERROR)
                for m in created
            ],
        )
        # A message whose every To is suppressed is born failed: its hook fires now.
        if failed := [m for m in created if m.status == Status.FAILED]:
            yield from hooks.fan_out(
                [(HookEvent.FAILED, m) for m in failed], message_facts, now=now
            )
        if dialect == "postgresql":
            # Delivered at commit, so idle workers wake exactly when the rows become visible.
            yield Step(select(func.pg_notify(NOTIFY_CHANNEL, "")))
    return results


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
    }


# --- PostgreSQL: a first use of an Idempotency-Key in one statement --------------------------
#
# POST /v1/messages with a key, on PostgreSQL, in its common case (one recipient, no explicit
# `from`, no attachments): the idempotency record (response included), the message and its
# history row go in with ONE statement of data-modifying CTEs, where the readable path
# (services.idempotency.execute + enqueue) makes about nine round trips. One statement is
# atomic by itself, so it runs without BEGIN/COMMIT (autocommit): one round trip. Each part
# depends on the one before:
#
#   blocked: the recipient is on the tenant's suppression list (then nothing is written);
#   took:    INSERT the record ... ON CONFLICT (tenant, key) DO NOTHING: a record holding the
#            key (live, expired, or being written by a racing request, which the INSERT waits
#            for) makes this empty, and nothing else is written;
#   made:    INSERT the message FROM took: a message that holds the key without a record (an
#            application enqueued it) fails the unique index, and the whole statement with it;
#   history: INSERT its creation row FROM made; and pg_notify (delivered at commit) FROM made.
#
# Anything but a written message (a replay, a 409, an expired record, a suppressed
# recipient, the unique-index error) has written nothing: the caller takes the readable
# path, which decides that case exactly as before. The fast path never decides a conflict.


def first_use_row(m: NewMessage, now: datetime, default_max_attempts: int) -> dict[str, Any]:
    """The row a first use writes: as `enqueue` would, nobody suppressed (the statement checks
    that), and no sender identity (the fast path takes no explicit `from`)."""
    return _new_row(m, now, default_max_attempts, frozenset(), None)


def first_use_message(row: dict[str, Any], m: NewMessage) -> Message:
    return _message(row, m)


def takes_first_use(m: NewMessage) -> bool:
    """Whether a message fits the one-statement path (see above)."""
    return (
        m.idempotency_key is not None
        and m.from_address is None
        and not m.attachments
        and m.recipients.is_single
    )


# What a first use writes of a message: every column but those a new message leaves NULL
# (claim, lease, provider, sending); the statement stays short and under psycopg's limits
# for caching its parsed form (4,096 characters, 50 parameters).
_FIRST_USE_COLUMNS = (
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
)
# The same value under one name: the tenant, the key and the time appear in several rows.
_SHARED = {
    "tenant_id": "tenant",
    "idempotency_key": "key",
    "created_at": "now",
    "updated_at": "now",
}
_LEFT_NULL = tuple(c for c in om.c.keys() if c not in _FIRST_USE_COLUMNS)  # noqa: SIM118
_RECORD_COLUMNS = ("operation", "fingerprint", "resource_id", "response_status", "response_body")


def created_message_sql(source: str) -> str:
    """Two CTEs, `made` and `made_history`: a new message row (first_use_row, its columns as
    parameters) and its creation history row, written once per row of CTE `source`. Also
    for a verification request's email (store.verifications.request_in_one_round_trip)."""
    columns = ", ".join(_FIRST_USE_COLUMNS)
    values = ", ".join(f":{_SHARED.get(c, c)}" for c in _FIRST_USE_COLUMNS)
    return f"""made AS (
    INSERT INTO outbox_messages ({columns})
    SELECT {values} FROM {source}
    RETURNING id, status
), made_history AS (
    INSERT INTO message_events (message_id, to_status, at, actor, attempt, detail)
    SELECT id, status, :now, :event_actor, :event_attempt, :event_detail FROM made
    RETURNING 1
)"""  # noqa: S608 (constant names only; every value is a bound parameter)


def created_message_types() -> dict[str, Any]:
    return {
        **{_SHARED.get(c, c): om.c[c].type for c in _FIRST_USE_COLUMNS},
        "event_actor": message_events.c.actor.type,
        "event_attempt": message_events.c.attempt.type,
        "event_detail": message_events.c.detail.type,
    }


def created_message_values(
    row: dict[str, Any], *, now: datetime, actor: str
) -> dict[str, Any] | None:
    """The parameters of created_message_sql; None when the row sets a column it leaves NULL
    (not a plain new message: the caller takes the readable path)."""
    event = history_row(MESSAGE_ROWS, row, None, at=now, actor=actor, event=LAST_ERROR)
    if event["provider_message_id"] is not None or any(row.get(c) is not None for c in _LEFT_NULL):
        return None
    values = {_SHARED.get(c, c): row[c] for c in _FIRST_USE_COLUMNS}
    values.update(
        event_actor=event["actor"], event_attempt=event["attempt"], event_detail=event["detail"]
    )
    return values


_FIRST_USE_SQL = f"""
WITH blocked AS (
    SELECT 1 FROM suppressions WHERE tenant_id = :tenant AND email = :blocked_email
), took AS (
    INSERT INTO idempotency_records (tenant_id, idempotency_key, created_at, expires_at,
        {", ".join(_RECORD_COLUMNS)})
    SELECT :tenant, :key, :now, :record_expires_at, {", ".join(f":{c}" for c in _RECORD_COLUMNS)}
    WHERE NOT EXISTS (SELECT 1 FROM blocked)
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING id
), {created_message_sql("took")}
SELECT
    (SELECT count(*) FROM took) AS took,
    (SELECT count(*) FROM made) AS made,
    (SELECT count(*) FROM made_history) AS history,
    (SELECT pg_notify('{NOTIFY_CHANNEL}', '') FROM made) AS notified
"""  # noqa: S608 (constant names only; every value is a bound parameter)


def _first_use_statement() -> Any:
    types = {
        **created_message_types(),
        **{c: idempotency_records.c[c].type for c in _RECORD_COLUMNS},
        "record_expires_at": idempotency_records.c.expires_at.type,
        "blocked_email": suppressions.c.email.type,
    }
    statement = text(_FIRST_USE_SQL).bindparams(*(bindparam(k, type_=t) for k, t in types.items()))
    # Its answer's columns, named (docs/sql records the statement from them).
    return statement.columns(took=Integer, made=Integer, history=Integer, notified=String)


_FIRST_USE: list[Any] = []  # built once: SQLAlchemy then reuses its compiled form


def enqueue_first_use(
    row: dict[str, Any], record: dict[str, Any], *, now: datetime, actor: str
) -> Plan[bool]:
    """PostgreSQL only: write `record` (an idempotency_records row, response included), the
    message `row` and its history row in one statement, atomic by itself (run it in
    autocommit). False: it wrote nothing; raises IntegrityError (the session's Conflict),
    having written nothing, when a message without a record holds the key. Either way the
    caller takes the readable path."""
    if (yield from current_dialect()) != "postgresql":
        return False  # the readable path is every database's
    values = created_message_values(row, now=now, actor=actor)
    if values is None:
        return False
    if not _FIRST_USE:
        _FIRST_USE.append(_first_use_statement())
    values.update({c: record[c] for c in _RECORD_COLUMNS})
    values.update(record_expires_at=record["expires_at"], blocked_email=row["to_address"].lower())
    answer = (yield Step(_FIRST_USE[0], values)).one()
    return bool(answer.took == answer.made == answer.history == 1)
