"""Email verifications: each state change goes through the same door as a message's
(`transition.apply_transition`), guarded and targeted by the verification machine."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import (
    ColumnElement,
    Insert,
    Row,
    and_,
    bindparam,
    func,
    insert,
    select,
    true,
    update,
)

from mailbag.database_url import Dialect
from mailbag.domain.states import Status
from mailbag.domain.verification import (
    ACTIVE,
    FOLLOWS,
    UNFINISHED,
    VERIFICATIONS,
    VAction,
    VState,
)
from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.schema import email_verifications as ev
from mailbag.store.schema import tenants, verification_events, verification_sends
from mailbag.store.schema import verification_send_counts as counts
from mailbag.store.transition import EventSpec, Tracked, apply_transition, history_row, record
from mailbag.store.types import insert_into

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
    locale: str | None = None  # its emails' (BCP 47; None: the template's default)


def _verification(row: Row[Any]) -> Verification:
    m = row._mapping
    values = {column.name: m[column.name] for column in ev.columns}
    values["state"] = VState(values["state"])
    return Verification(**values)


def created_row(values: Mapping[str, Any], *, now: datetime) -> dict[str, Any]:
    """The row `create` inserts: `values` in the state the machine creates a row in."""
    return {
        **values,
        "state": VERIFICATIONS.target(VAction.CREATE).value,
        "created_at": now,
        "updated_at": now,
        "confirm_attempts": 0,
        "send_count": 0,
        "sent_at": None,
        "verified_at": None,
    }


def moved(
    row: Mapping[str, Any], action: VAction, values: Mapping[str, Any], *, now: datetime
) -> dict[str, Any]:
    """`row` as `transition(action, values=values)` leaves it (the machine's target)."""
    if VState(row["state"]) not in VERIFICATIONS.sources(action):
        raise ValueError(f"{action.value} does not move a verification that is {row['state']}")
    return {**row, **values, "state": VERIFICATIONS.target(action).value, "updated_at": now}


def verification_of(row: Mapping[str, Any]) -> Verification:
    return Verification(**{**row, "state": VState(row["state"])})


def create(values: Mapping[str, Any], *, now: datetime, actor: str) -> Plan[Verification]:
    """Insert a new verification in `created`; raises IntegrityError if one is active."""
    row = created_row(values, now=now)
    yield Step(insert(ev).values(row))
    yield from record(
        VERIFICATION_ROWS,
        [history_row(VERIFICATION_ROWS, row, None, at=now, actor=actor, event=EventSpec())],
    )
    return verification_of(row)


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


def expire_stale(now: datetime, *, actor: str, limit: int) -> Plan[int]:
    """Move up to `limit` verifications whose time is up but that nobody has read since (a
    read expires them too) to `expired`, each with its event. Rows another transaction
    holds are skipped; the next run takes them."""
    moved = yield from apply_transition(
        VERIFICATION_ROWS,
        VAction.EXPIRE,
        where=matching(VerificationFilter(expired_by=now)),
        values={},
        now=now,
        actor=actor,
        limit=limit,
        skip_locked=True,
        event=EventSpec(text="token expired"),
    )
    return len(moved)


class _Message(Protocol):
    """What follow_messages reads of a changed message (a Message or a Settled row)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def status(self) -> str: ...
    @property
    def metadata(self) -> Mapping[str, Any]: ...


class _Changed(Protocol):
    """A message transition's changed row (message_transitions.Changed)."""

    @property
    def message(self) -> _Message: ...


def follow_messages(
    changed: Sequence[_Changed], *, now: datetime, actor: str
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


def of_address(tenant_id: Any, email: Any) -> ColumnElement[bool]:
    """A tenant's verifications of one address (values, or parameters: store/first_use.py)."""
    return and_(ev.c.tenant_id == tenant_id, ev.c.email == email)


def active_for(tenant_id: str, email: str) -> Plan[Verification | None]:
    query = select(ev).where(of_address(tenant_id, email), VERIFICATION_ROWS.in_states(ACTIVE))
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
    other reads of the row never wait. SQLite needs none, and runs nothing: BEGIN IMMEDIATE
    already runs its writers one at a time. The sends of one tenant queue behind each
    other, which the tenant's own hourly limit keeps far below what one row lock can pass.
    """
    dialect = yield from current_dialect()
    for step in lock_steps(tenant_id, dialect):  # noqa: UP028 - a list cannot take a Result
        yield step


_LOCK = (
    select(tenants.c.id)
    .where(tenants.c.id == bindparam("tenant_id", type_=tenants.c.id.type))
    .with_for_update(key_share=True)
)


def lock_steps(tenant_id: str, dialect: Dialect) -> tuple[Step, ...]:
    """lock_sends's statement, if the dialect needs one (built once: it may go in a batch
    with what it protects, store/first_use.py)."""
    return () if dialect == "sqlite" else (Step(_LOCK, {"tenant_id": tenant_id}),)


def minute_of(at: datetime) -> datetime:
    """The minute a send is counted in (PostgreSQL's date_trunc('minute', at) alike)."""
    return at.replace(second=0, microsecond=0)


def counting(dialect: Dialect) -> Insert:
    """The INSERT of a tenant's minute that adds its `n` to the minute's count if the row
    is there already (one statement: ON CONFLICT DO UPDATE / ON DUPLICATE KEY UPDATE)."""
    statement = insert_into(dialect, counts)
    if dialect == "mysql":
        return statement.on_duplicate_key_update(n=counts.c.n + statement.inserted.n)  # type: ignore[no-any-return]
    excluded = statement.excluded.n
    return statement.on_conflict_do_update(  # type: ignore[no-any-return]
        index_elements=[counts.c.tenant_id, counts.c.minute], set_={"n": counts.c.n + excluded}
    )


def send_rows(
    *, tenant_id: str, email: str, verification_id: uuid.UUID, now: datetime
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What one send writes: its row (the per-address limit counts them) and one more in
    its tenant's minute (the tenant's limit sums those)."""
    send = {"tenant_id": tenant_id, "email": email, "verification_id": verification_id, "at": now}
    return send, {"tenant_id": tenant_id, "minute": minute_of(now), "n": 1}


def record_send(
    *, tenant_id: str, email: str, verification_id: uuid.UUID, now: datetime
) -> Plan[None]:
    """The send's row and one more in its tenant's minute (send_rows); runs under
    lock_sends, as every send does."""
    dialect = yield from current_dialect()
    send, minute = send_rows(
        tenant_id=tenant_id, email=email, verification_id=verification_id, now=now
    )
    yield Step(insert(verification_sends).values(send))
    yield Step(counting(dialect).values(minute))


def sent_to(tenant_id: Any, since: Any, email: Any) -> ColumnElement[bool]:
    """The sends the per-address limit counts (values, or parameters)."""
    s = verification_sends.c
    return and_(s.tenant_id == tenant_id, s.at > since, s.email == email)


def minutes_of(tenant_id: Any, since_minute: Any) -> ColumnElement[bool]:
    """The per-minute counts the tenant's limit sums, from the minute holding the time."""
    return and_(counts.c.tenant_id == tenant_id, counts.c.minute >= since_minute)


def tenant_sends_since(tenant_id: str, since: datetime) -> Plan[tuple[int, datetime | None]]:
    """How many verification emails the tenant sent since a time, counted by whole minutes:
    the minute holding `since` counts whole, so at most 61 rows are read whatever the
    traffic, and the count errs only on the safe side (a send up to one minute older than
    the hour may still count: the limit is never exceeded in any hour). With the count,
    when the oldest counted minute stops counting, less an hour (as sends_since's oldest:
    Retry-After is that plus an hour, less now)."""
    query = select(
        func.sum(counts.c.n).label("n"), func.min(counts.c.minute).label("oldest")
    ).where(minutes_of(tenant_id, minute_of(since)))
    row = (yield Step(query)).one()
    oldest = row.oldest
    if isinstance(oldest, str):  # SQLite's min() over a datetime column comes back as text
        oldest = datetime.fromisoformat(oldest).replace(tzinfo=since.tzinfo)
    return int(row.n or 0), (oldest + timedelta(minutes=1) if oldest else None)


def sends_since(
    tenant_id: str, since: datetime, email: str | None = None
) -> Plan[tuple[int, datetime | None]]:
    """How many verification emails went out since a time, and the oldest of them."""
    s = verification_sends.c
    query = select(func.count().label("n"), func.min(s.at).label("oldest"))
    if email is None:
        query = query.where(s.tenant_id == tenant_id, s.at > since)
    else:
        query = query.where(sent_to(tenant_id, since, email))
    row = (yield Step(query)).one()
    oldest = row.oldest
    if isinstance(oldest, str):  # SQLite's min() over a datetime column comes back as text
        oldest = datetime.fromisoformat(oldest).replace(tzinfo=since.tzinfo)
    return int(row.n), oldest
