"""Every state change of an outbox message, as SQL you can read in one place.

Each change is ONE conditional UPDATE guarded by the states the domain's transition table
allows (and, for finalizes, by the claim token). It returns the rows it changed, and the
same transaction appends one `message_events` row per change. How each database runs a
guarded UPDATE is in one place, `transition.guarded_update`.

Nothing here holds a transaction across provider I/O: callers claim, commit, send, then
finalize in a new transaction.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from sqlalchemy import (
    ColumnElement,
    Row,
    String,
    and_,
    case,
    delete,
    exists,
    func,
    insert,
    literal,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import mysql as mysql_dialect
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

from mailbag.domain import states
from mailbag.domain.ids import uuid7
from mailbag.domain.message import ERROR_MAX, Message, NewMessage, truncate_error
from mailbag.domain.states import Action, Status
from mailbag.store import suppressions as suppression_store
from mailbag.store.database import Dialect
from mailbag.store.plan import Plan, Step
from mailbag.store.schema import message_events, outbox_messages
from mailbag.store.transition import guarded_update
from mailbag.store.types import UTCDateTime

om = outbox_messages
NOTIFY_CHANNEL = "mailbag_outbox"
# MariaDB's generated stand-in for the partial claim index (see schema.py).
_MYSQL_CLAIMABLE_AT = literal_column("claimable_at", UTCDateTime())
LEASE_EXPIRED = "lease expired before the send was finalized; the provider may have accepted it"


M = TypeVar("M", bound="Message | Settled")


@dataclass(frozen=True)
class Changed(Generic[M]):
    """A row an operation changed, as it is now (a Message, or a Settled summary), and the
    state it left."""

    message: M
    from_status: Status


@dataclass(frozen=True)
class Settled:
    """The part of a changed row a worker's finalize needs back (`finalize(light=True)`):
    no template data, headers or tags to decode, thousands of times a second."""

    id: uuid.UUID
    tenant_id: str
    status: str
    attempt_count: int
    template_name: str
    metadata: Mapping[str, Any]
    provider_message_id: str | None
    last_error: str | None
    claimed_by: str | None


SETTLED_COLUMNS = tuple(Settled.__dataclass_fields__)


@dataclass(frozen=True)
class Enqueued:
    message: Message
    created: bool  # False: the idempotency key was taken; `message` is the one already there


@dataclass(frozen=True)
class Claim:
    token: uuid.UUID
    messages: list[Message]


@dataclass(frozen=True)
class Finalization:
    """What a worker learned about one claimed message, as the domain decided it."""

    message_id: uuid.UUID
    action: Action  # MARK_SENT, RETRY, FAIL, BURY, MARK_UNKNOWN or RELEASE
    provider_message_id: str | None = None
    error: str | None = None
    next_attempt_at: datetime | None = None
    # A retry that reuses the provider idempotency key of an ambiguous send: the attempt is
    # not spent, so the next one carries the same number and therefore the same key, and
    # `ambiguous_since` records when that key was first used.
    keep_attempt: bool = False
    ambiguous_since: datetime | None = None


@dataclass(frozen=True)
class Finalized:
    changed: list[Changed[Settled]]
    stale: list[uuid.UUID] = field(default_factory=list)  # the claim was no longer ours


FINALIZE_ACTIONS = frozenset(
    {Action.MARK_SENT, Action.RETRY, Action.FAIL, Action.BURY, Action.MARK_UNKNOWN, Action.RELEASE}
)


@dataclass(frozen=True)
class EventSpec:
    """What a transition's `message_events` row says beyond from/to/at/actor, stated so that
    it can be computed in Python or in SQL from the changed row (see `_transition`).

    attempt = the row's attempt_count + `attempt_offset`; detail = `text`, or the row's
    `column` between `prefix` and `suffix`.
    """

    attempt_offset: int = 0
    text: str | None = None
    column: str | None = None
    prefix: str = ""
    suffix: str = ""

    def detail(self, message: Message | Settled) -> str | None:
        if self.column is None:
            return self.text
        value = getattr(message, self.column)
        if value is None:
            return None if not self.prefix else f"{self.prefix}?{self.suffix}"
        return f"{self.prefix}{value}{self.suffix}"

    def detail_sql(self, row: Any) -> ColumnElement[Any]:
        if self.column is None:
            return literal(truncate_error(self.text), message_events.c.detail.type)
        value = row.c[self.column]
        if not self.prefix and not self.suffix:
            return func.substr(value, 1, ERROR_MAX)
        text = (
            literal(self.prefix, String())
            + func.coalesce(value, "?")
            + literal(self.suffix, String())
        )
        return func.substr(text, 1, ERROR_MAX)


LAST_ERROR = EventSpec(column="last_error")
_FINALIZE_EVENTS: dict[Action, EventSpec] = {
    Action.MARK_SENT: EventSpec(),
    Action.RELEASE: EventSpec(attempt_offset=1, text="released unsent; no attempt spent"),
}
_CLAIM_CLEARED: dict[str, Any] = {
    "claim_token": None,
    "claimed_by": None,
    "claimed_at": None,
    "lease_expires_at": None,
}


# --- the one mechanism every state change goes through -------------------------------------


def _in_states(statuses: frozenset[Status]) -> ColumnElement[bool]:
    # Literals, not bound parameters: PostgreSQL can only match a partial index whose
    # predicate it can prove from the query text, including under generic prepared plans.
    return om.c.status.in_([literal_column(f"'{s.value}'") for s in sorted(statuses)])


def _allowed_by(action: Action) -> ColumnElement[bool]:
    return _in_states(states.sources(action))


_MESSAGE_COLUMNS = len(om.columns)
# Rows are turned into Messages by position (the hot path of every claim and finalize):
# the dataclass must list the table's columns in the table's order.
assert list(Message.__dataclass_fields__) == [c.name for c in om.columns]


def _settled(row: Row[Any]) -> Settled:
    return Settled(*row[: len(SETTLED_COLUMNS)])


def message_from_row(row: Row[Any]) -> Message:
    """A Message from a row that starts with all of outbox_messages' columns, in order."""
    return Message(*row[:_MESSAGE_COLUMNS])


def _transition(
    dialect: Dialect,
    action: Action,
    *,
    where: ColumnElement[bool],
    values: Mapping[str, Any],
    now: datetime,
    actor: str,
    order_by: Sequence[ColumnElement[Any]] = (),
    limit: int | None = None,
    skip_locked: bool = False,
    event: EventSpec = EventSpec(),
) -> Plan[list[Changed[Message]]]:
    return (
        yield from _apply(
            dialect,
            action,
            where=where,
            values=values,
            now=now,
            actor=actor,
            order_by=order_by,
            limit=limit,
            skip_locked=skip_locked,
            event=event,
            as_row=message_from_row,
        )
    )


def _apply(
    dialect: Dialect,
    action: Action,
    *,
    where: ColumnElement[bool],
    values: Mapping[str, Any],
    now: datetime,
    actor: str,
    as_row: Callable[[Row[Any]], M],
    order_by: Sequence[ColumnElement[Any]] = (),
    limit: int | None = None,
    skip_locked: bool = False,
    event: EventSpec = EventSpec(),
) -> Plan[list[Changed[M]]]:
    """Apply `values` to the rows matching `where` (and allowed by `action`), log the events.

    On PostgreSQL the events are written by the same statement (a data-modifying CTE);
    elsewhere by one executemany in the same transaction.
    """
    actor = actor[:200]

    def log(updated: Any) -> Any:
        return insert(message_events).from_select(
            [
                "message_id",
                "from_status",
                "to_status",
                "at",
                "actor",
                "attempt",
                "provider_message_id",
                "detail",
            ],
            select(
                updated.c.id,
                updated.c.previous_state,
                updated.c.status,
                literal(now, message_events.c.at.type),
                literal(actor, String()),
                updated.c.attempt_count + event.attempt_offset,
                updated.c.provider_message_id,
                event.detail_sql(updated),
            ),
        )

    updated = yield from guarded_update(
        dialect,
        om,
        state="status",
        guard=and_(_allowed_by(action), where),
        values={**values, "updated_at": now},
        order_by=order_by,
        limit=limit,
        skip_locked=skip_locked,
        log=log if dialect == "postgresql" else None,
        columns=SETTLED_COLUMNS if as_row is _settled else None,
    )
    changed = [Changed(as_row(row), Status(previous)) for row, previous in updated]
    if changed and dialect != "postgresql":
        yield from _append_events(
            _event(
                c.message.id,
                c.from_status,
                c.message.status,
                now,
                actor,
                c.message.attempt_count + event.attempt_offset,
                c.message.provider_message_id,
                event.detail(c.message),
            )
            for c in changed
        )
    return changed


_INSERT_EVENTS = insert(message_events)


def _append_events(rows: Iterable[dict[str, Any]]) -> Plan[None]:
    """One executemany of a cached INSERT: the driver sends the rows in a pipeline (psycopg)
    or batches them; never a statement compiled anew for each batch."""
    pending = list(rows)
    if pending:
        yield Step(_INSERT_EVENTS, pending)


def _event(
    message_id: uuid.UUID,
    from_status: Status | None,
    to_status: str,
    at: datetime,
    actor: str,
    attempt: int,
    provider_message_id: str | None,
    detail: str | None,
) -> dict[str, Any]:
    return {
        "message_id": message_id,
        "from_status": from_status.value if from_status else None,
        "to_status": to_status,
        "at": at,
        "actor": actor[:200],
        "attempt": attempt,
        "provider_message_id": provider_message_id,
        "detail": truncate_error(detail),
    }


def _per_row(values: Mapping[uuid.UUID, Any], type_: Any, keep: Any = None) -> Any:
    """`CASE id WHEN ... THEN ... END`: per-row values in one set-based UPDATE.

    Rows whose value is None keep `keep` (the column's current value) when it is given.
    """
    if keep is not None:
        values = {key: value for key, value in values.items() if value is not None}
        if not values:
            return keep
    distinct = {repr(value) for value in values.values()}
    if len(distinct) == 1 and keep is None:
        return literal(next(iter(values.values())), type_)
    whens = {key: literal(value, type_) for key, value in values.items()}
    return case(whens, value=om.c.id, else_=keep if keep is not None else literal(None, type_))


# --- enqueue ---------------------------------------------------------------------------------


def enqueue(
    dialect: Dialect,
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
    suppressed = yield from suppression_store.among((m.tenant_id, m.to_address) for m in messages)
    rows = [
        _new_row(m, now, default_max_attempts, (m.tenant_id, m.to_address.lower()) in suppressed)
        for m in messages
    ]
    yield Step(_insert_ignoring_taken_keys(dialect), rows)

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
        yield from _append_events(
            _event(m.id, None, m.status, now, actor, 0, None, m.last_error) for m in created
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
        "status": (Status.FAILED if suppressed else Status.PENDING).value,
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


def _insert_ignoring_taken_keys(dialect: Dialect) -> Any:
    if dialect == "postgresql":
        return pg_dialect.insert(om).on_conflict_do_nothing(
            index_elements=[om.c.tenant_id, om.c.idempotency_key]
        )
    if dialect == "sqlite":
        return sqlite_dialect.insert(om).on_conflict_do_nothing(
            index_elements=[om.c.tenant_id, om.c.idempotency_key]
        )
    # Not INSERT IGNORE: that would also turn truncation and other errors into warnings.
    return mysql_dialect.insert(om).on_duplicate_key_update(id=om.c.id)


# --- the worker's operations -------------------------------------------------------------


def claim(
    dialect: Dialect,
    *,
    worker_id: str,
    now: datetime,
    lease: timedelta,
    limit: int,
) -> Plan[Claim]:
    """Take up to `limit` due messages, oldest due first, under one fresh claim token."""
    token = uuid.uuid4()
    if dialect == "mysql":
        due, order = now >= _MYSQL_CLAIMABLE_AT, (_MYSQL_CLAIMABLE_AT, om.c.id)
    else:
        due, order = om.c.next_attempt_at <= now, (om.c.next_attempt_at, om.c.id)
    changed = yield from _transition(
        dialect,
        Action.CLAIM,
        where=due,
        values={
            "status": Status.PROCESSING.value,
            "claim_token": token,
            "claimed_by": worker_id,
            "claimed_at": now,
            "lease_expires_at": now + lease,
        },
        now=now,
        actor=worker_id,
        order_by=order,
        limit=limit,
        skip_locked=True,
        event=EventSpec(attempt_offset=1),
    )
    claimed = sorted((c.message for c in changed), key=lambda m: (m.next_attempt_at, m.id))
    return Claim(token, claimed)


def extend_lease(
    dialect: Dialect,
    *,
    token: uuid.UUID,
    ids: Sequence[uuid.UUID],
    now: datetime,
    lease: timedelta,
) -> Plan[int]:
    """Push the lease of messages still in flight; not a transition, so no event."""
    if not ids:
        return 0
    result = yield Step(
        update(om)
        .where(om.c.id.in_(ids), om.c.claim_token == token, om.c.status == Status.PROCESSING.value)
        .values(lease_expires_at=now + lease, updated_at=now)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def finalize(
    dialect: Dialect,
    *,
    token: uuid.UUID,
    outcomes: Sequence[Finalization],
    now: datetime,
    actor: str,
    provider: str | None = None,
) -> Plan[Finalized]:
    """Record what happened to claimed messages, only where the claim is still ours.

    The changed rows come back as `Settled` summaries: a worker finalizes thousands of
    messages a second and needs none of their template data.

    Outcomes are grouped so that a batch costs one UPDATE per kind of outcome, however many
    messages it holds. A row whose token no longer matches (the lease expired and was swept,
    or another worker holds it now) is left alone and reported as stale.
    """
    groups: dict[tuple[Action, bool], list[Finalization]] = defaultdict(list)
    for outcome in outcomes:
        if outcome.action not in FINALIZE_ACTIONS:
            raise ValueError(f"{outcome.action} is not a finalize action")
        groups[(outcome.action, outcome.keep_attempt)].append(outcome)

    changed: list[Changed[Settled]] = []
    for (action, keep_attempt), group in groups.items():
        ids = [o.message_id for o in group]
        values = _finalize_values(action, keep_attempt, group, now, provider)
        changed += yield from _apply(
            dialect,
            action,
            as_row=_settled,
            where=and_(om.c.id.in_(ids), om.c.claim_token == token),
            values=values,
            now=now,
            actor=actor,
            event=_FINALIZE_EVENTS.get(action)
            or (EventSpec(attempt_offset=1, column="last_error") if keep_attempt else LAST_ERROR),
        )
    done = {c.message.id for c in changed}
    return Finalized(changed, [o.message_id for o in outcomes if o.message_id not in done])


def _finalize_values(
    action: Action,
    keep_attempt: bool,
    group: Sequence[Finalization],
    now: datetime,
    provider: str | None,
) -> dict[str, Any]:
    spends_attempt = action is not Action.RELEASE and not keep_attempt
    values: dict[str, Any] = {
        **_CLAIM_CLEARED,
        "attempt_count": om.c.attempt_count + (1 if spends_attempt else 0),
    }
    if action is Action.RELEASE:
        values["status"] = case(
            (om.c.attempt_count > 0, literal_column(f"'{Status.RETRYING.value}'")),
            else_=literal_column(f"'{Status.PENDING.value}'"),
        )
        return values
    values["status"] = states.target(action).value
    values["provider"] = provider
    errors = {o.message_id: truncate_error(o.error) for o in group}
    provider_ids = {o.message_id: o.provider_message_id for o in group}
    if action is Action.MARK_SENT:
        values.update(
            sent_at=now,
            ambiguous_since=None,
            provider_message_id=_per_row(
                provider_ids, om.c.provider_message_id.type, om.c.provider_message_id
            ),
        )
        return values
    values["last_error"] = _per_row(errors, om.c.last_error.type, None)
    if action is Action.MARK_UNKNOWN:
        values["provider_message_id"] = _per_row(
            provider_ids, om.c.provider_message_id.type, om.c.provider_message_id
        )
    if action is Action.RETRY:
        next_at = {o.message_id: o.next_attempt_at or now for o in group}
        values["next_attempt_at"] = _per_row(next_at, UTCDateTime(), None)
        since = {o.message_id: o.ambiguous_since for o in group}
        values["ambiguous_since"] = _per_row(since, UTCDateTime()) if keep_attempt else None
    elif action is not Action.MARK_UNKNOWN:
        values["ambiguous_since"] = None
    return values


def sweep_expired(
    dialect: Dialect, *, now: datetime, actor: str, limit: int = 1000
) -> Plan[list[Changed[Message]]]:
    """Expired leases become `unknown`, never a blind resend. Safe to run from every replica:
    rows another sweeper holds are skipped, and a swept row no longer matches."""
    return (
        yield from _transition(
            dialect,
            Action.EXPIRE,
            where=om.c.lease_expires_at < now,
            values={
                "status": Status.UNKNOWN.value,
                "attempt_count": om.c.attempt_count + 1,
                "claim_token": None,
                "lease_expires_at": None,
                "last_error": LEASE_EXPIRED,
            },
            now=now,
            actor=actor,
            order_by=(om.c.lease_expires_at, om.c.id),
            limit=limit,
            skip_locked=True,
            event=EventSpec(column="claimed_by", prefix="lease of ", suffix=" expired"),
        )
    )


# --- operator operations -----------------------------------------------------------------------


def requeue(
    dialect: Dialect,
    *,
    where: ColumnElement[bool],
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
        yield from _transition(
            dialect,
            Action.REQUEUE,
            where=where,
            values={
                "status": Status.PENDING.value,
                "next_attempt_at": now,
                "max_attempts": om.c.attempt_count + extra_attempts,
                "ambiguous_since": None,
                **_CLAIM_CLEARED,
            },
            now=now,
            actor=actor,
            order_by=(om.c.id,),
            limit=limit,
            event=EventSpec(text="requeued by an operator"),
        )
    )


def cancel(
    dialect: Dialect, *, where: ColumnElement[bool], now: datetime, actor: str
) -> Plan[list[Changed[Message]]]:
    """Withdraw pending messages (never one a worker holds or already tried)."""
    return (
        yield from _transition(
            dialect,
            Action.CANCEL,
            where=where,
            values={"status": Status.CANCELLED.value},
            now=now,
            actor=actor,
            event=EventSpec(text="cancelled"),
        )
    )


def resolve(
    dialect: Dialect,
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
        values.update(status=Status.SENT.value, sent_at=now)
        if provider_message_id:
            values["provider_message_id"] = provider_message_id
    else:
        values.update(status=Status.FAILED.value, last_error=truncate_error(evidence))
    return (
        yield from _transition(
            dialect,
            Action.RESOLVE_SENT if sent else Action.RESOLVE_FAILED,
            where=om.c.id == message_id,
            values=values,
            now=now,
            actor=actor,
            event=EventSpec(text=evidence),
        )
    )


def flag(
    dialect: Dialect, *, message_id: uuid.UUID, now: datetime, actor: str, detail: str
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
        yield from _transition(
            dialect,
            Action.FLAG,
            where=and_(om.c.id == message_id, ~flagged_since_last_change),
            values={},
            now=now,
            actor=actor,
            event=EventSpec(text=detail),
        )
    )


def expired_before(message_ids: Sequence[uuid.UUID]) -> Plan[set[uuid.UUID]]:
    """Which of these messages had a lease expire more than once (the alert's signal)."""
    if not message_ids:
        return set()
    query = (
        select(message_events.c.message_id)
        .where(
            message_events.c.message_id.in_(message_ids),
            message_events.c.from_status == Status.PROCESSING.value,
            message_events.c.to_status == Status.UNKNOWN.value,
            message_events.c.actor != "reconciler",
            message_events.c.detail.like("lease of %"),
        )
        .group_by(message_events.c.message_id)
        .having(func.count() > 1)
    )
    return set((yield Step(query)).scalars().all())


def purge(dialect: Dialect, *, older_than: datetime, limit: int = 1000) -> Plan[int]:
    """Delete up to `limit` terminal messages (and their events) last changed before a cutoff.

    Callers repeat it until it returns less than `limit`, one short transaction per chunk, so
    a large purge never holds locks for long. `unknown` messages are never purged.
    """
    old = and_(_in_states(states.TERMINAL), om.c.updated_at < older_than)
    oldest = select(om.c.id).where(old).order_by(om.c.updated_at).limit(limit)
    ids = (yield Step(oldest)).scalars().all()
    if not ids:
        return 0
    yield Step(delete(message_events).where(message_events.c.message_id.in_(ids)))
    result = yield Step(delete(om).where(om.c.id.in_(ids), old))
    return int(result.rowcount)  # type: ignore[attr-defined]


# --- reads --------------------------------------------------------------------------------------


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
