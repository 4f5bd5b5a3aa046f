"""Email verifications: each state change goes through the same door as a message's
(`transition.apply_transition`), guarded and targeted by the verification machine."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Row, and_, func, insert, select, true, update

from mailbag.domain.states import Status
from mailbag.domain.verification import (
    ACTIVE,
    FOLLOWS,
    UNFINISHED,
    VERIFICATIONS,
    VAction,
    VState,
)
from mailbag.store.plan import Plan, Step
from mailbag.store.schema import email_verifications as ev
from mailbag.store.schema import tenants, verification_events, verification_sends
from mailbag.store.transition import EventSpec, Tracked, apply_transition, history_row, record

if TYPE_CHECKING:  # message_transitions calls this module: no import cycle at run time
    from mailbag.store.message_transitions import Changed

VERIFICATION_ROWS: Tracked[VState, VAction] = Tracked(
    table=ev,
    state="state",
    machine=VERIFICATIONS,
    history=verification_events,
    subject="verification_id",
    copied={"message_id": "message_id"},
)


@dataclass(frozen=True)
class VerificationFilter:
    """Which verifications are meant (every field optional; all given ones must hold).
    Plain data: `matching` is its SQL."""

    id: uuid.UUID | None = None
    tenant_id: str | None = None
    email: str | None = None
    message_ids: Sequence[uuid.UUID] | None = None  # their current email is one of these
    expired_by: datetime | None = None  # expires_at at or before this
    send_count: int | None = None  # still on this send (a rotation reads it first)
    token_digest: str | None = None
    confirm_attempts_below: int | None = None


def matching(where: VerificationFilter) -> ColumnElement[bool]:
    """The SQL of a verification filter."""
    conditions: list[ColumnElement[bool]] = []
    if where.id is not None:
        conditions.append(ev.c.id == where.id)
    if where.tenant_id is not None:
        conditions.append(ev.c.tenant_id == where.tenant_id)
    if where.email is not None:
        conditions.append(ev.c.email == where.email)
    if where.message_ids is not None:
        conditions.append(ev.c.message_id.in_(where.message_ids))
    if where.expired_by is not None:
        conditions.append(ev.c.expires_at <= where.expired_by)
    if where.send_count is not None:
        conditions.append(ev.c.send_count == where.send_count)
    if where.token_digest is not None:
        conditions.append(ev.c.token_digest == where.token_digest)
    if where.confirm_attempts_below is not None:
        conditions.append(ev.c.confirm_attempts < where.confirm_attempts_below)
    return and_(true(), *conditions)


@dataclass(frozen=True)
class Verification:
    id: uuid.UUID
    tenant_id: str
    email: str
    state: VState
    token_digest: str
    expires_at: datetime
    confirm_attempts: int
    send_count: int
    message_id: uuid.UUID | None
    template_name: str
    redirect_url: str | None
    created_at: datetime
    updated_at: datetime
    sent_at: datetime | None
    verified_at: datetime | None


def _verification(row: Row[Any]) -> Verification:
    m = row._mapping
    values = {column.name: m[column.name] for column in ev.columns}
    values["state"] = VState(values["state"])
    return Verification(**values)


def create(values: Mapping[str, Any], *, now: datetime, actor: str) -> Plan[Verification]:
    """Insert a new verification in `created`; raises IntegrityError if one is active."""
    row = {
        **values,
        "state": VState.CREATED.value,
        "created_at": now,
        "updated_at": now,
        "confirm_attempts": 0,
        "send_count": 0,
        "sent_at": None,
        "verified_at": None,
    }
    yield Step(insert(ev).values(row))
    yield from record(
        VERIFICATION_ROWS,
        [history_row(VERIFICATION_ROWS, row, None, at=now, actor=actor, event=EventSpec())],
    )
    return Verification(**{**row, "state": VState.CREATED})


def transition(
    action: VAction,
    *,
    where: VerificationFilter,
    now: datetime,
    actor: str,
    values: Mapping[str, Any] | None = None,
    detail: str | None = None,
) -> Plan[list[Verification]]:
    """Move the verifications matching `where` that `action` allows, and log each move."""
    moved = yield from apply_transition(
        VERIFICATION_ROWS,
        action,
        where=matching(where),
        values=values or {},
        now=now,
        actor=actor,
        event=EventSpec(text=detail),
    )
    return [_verification(row) for row, _ in moved]


def follow_messages(
    changed: Sequence[Changed[Any]], *, now: datetime, actor: str
) -> Plan[list[Verification]]:
    """Carry outbox results over to the verifications whose current email they concern.

    Runs in the transaction that changed the messages, so the two never disagree. Only the
    verification's *current* message counts (a result for a rotated-away send is ignored),
    and the guard keeps `verified` and `expired` rows where they are.
    """
    by_action: dict[VAction, list[uuid.UUID]] = defaultdict(list)
    for c in changed:
        if "verification_id" not in c.message.metadata:
            continue  # most messages are not verification emails: no query for them
        action = FOLLOWS.get(Status(c.message.status))
        if action is not None:
            by_action[action].append(c.message.id)
    moved: list[Verification] = []
    for action, message_ids in by_action.items():
        extra = {"sent_at": now} if action is VAction.MESSAGE_SENT else None
        moved += yield from transition(
            action,
            where=VerificationFilter(message_ids=message_ids),
            now=now,
            actor=actor,
            values=extra,
            detail=f"outbox message {action.value.removeprefix('message_')}",
        )
    return moved


def count_wrong_token(verification_id: uuid.UUID, now: datetime) -> Plan[None]:
    """A wrong confirmation token: one attempt fewer (not a transition, so no event)."""
    yield Step(
        update(ev)
        .where(ev.c.id == verification_id, VERIFICATION_ROWS.in_states(UNFINISHED))
        .values(confirm_attempts=ev.c.confirm_attempts + 1, updated_at=now)
    )


def get(verification_id: uuid.UUID, tenant_id: str) -> Plan[Verification | None]:
    query = select(ev).where(ev.c.id == verification_id, ev.c.tenant_id == tenant_id)
    row = (yield Step(query)).first()
    return _verification(row) if row else None


def active_for(tenant_id: str, email: str) -> Plan[Verification | None]:
    query = select(ev).where(
        ev.c.tenant_id == tenant_id, ev.c.email == email, VERIFICATION_ROWS.in_states(ACTIVE)
    )
    row = (yield Step(query)).first()
    return _verification(row) if row else None


def events(verification_id: uuid.UUID) -> Plan[list[Row[Any]]]:
    query = (
        select(verification_events)
        .where(verification_events.c.verification_id == verification_id)
        .order_by(verification_events.c.id)
    )
    return list((yield Step(query)).all())


def lock_sends(tenant_id: str) -> Plan[None]:
    """Hold the tenant's verification-send lock until the transaction ends.

    Every verification request and resend takes it before it reads anything, so the send
    limits (per address and per tenant) are counted and spent by one transaction at a time
    and a resend always rotates from the newest send. The lock is the tenant's row: FOR NO
    KEY UPDATE on PostgreSQL (it blocks no foreign-key check), FOR UPDATE on MariaDB/MySQL;
    other reads of the row never wait. SQLite needs none: BEGIN IMMEDIATE already runs its
    writers one at a time. The sends of one tenant queue behind each other, which the
    tenant's own hourly limit keeps far below what one row lock can pass.
    """
    yield Step(
        select(tenants.c.id).where(tenants.c.id == tenant_id).with_for_update(key_share=True)
    )


def record_send(
    *, tenant_id: str, email: str, verification_id: uuid.UUID, now: datetime
) -> Plan[None]:
    yield Step(
        insert(verification_sends).values(
            tenant_id=tenant_id, email=email, verification_id=verification_id, at=now
        )
    )


def sends_since(
    tenant_id: str, since: datetime, email: str | None = None
) -> Plan[tuple[int, datetime | None]]:
    """How many verification emails went out since a time, and the oldest of them."""
    query = select(
        func.count().label("n"), func.min(verification_sends.c.at).label("oldest")
    ).where(verification_sends.c.tenant_id == tenant_id, verification_sends.c.at > since)
    if email is not None:
        query = query.where(verification_sends.c.email == email)
    row = (yield Step(query)).one()
    oldest = row.oldest
    if isinstance(oldest, str):  # SQLite's min() over a datetime column comes back as text
        oldest = datetime.fromisoformat(oldest).replace(tzinfo=since.tzinfo)
    return int(row.n), oldest
