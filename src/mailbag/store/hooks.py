"""Event hooks in the database: endpoints, the fan-out of message events into deliveries,
and the deliveries' own outbox (claim under a lease, finalize, sweep, replay).

The fan-out runs inside the transaction that changed a message (message_transitions'
`transition`, events' `store`): a rolled-back change delivers nothing, a committed one its
events to every endpoint subscribed at that moment. It costs one SELECT of the tenants'
enabled endpoints per batch, and an INSERT of the deliveries only when one subscribes;
nothing at all for a batch without an event (a claim) or while hooks are off.

Deliveries move through domain.hooks.DELIVERIES with the same machinery as messages
(transition.apply_transition: guarded UPDATE, SKIP LOCKED claims, history rows).
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from sqlalchemy import (
    ColumnElement,
    Row,
    and_,
    case,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    true,
    update,
)

from mailbag.domain.hooks import (
    CLAIMABLE_DELIVERIES,
    DELIVERIES,
    Breaker,
    DAction,
    DeliveryEvent,
    DState,
    HookDelivery,
    HookEndpoint,
    HookEvent,
    MessageFacts,
    events_column,
    events_from_column,
    payload,
    webhook_id_for,
)
from mailbag.domain.ids import uuid7
from mailbag.domain.message import truncate_error
from mailbag.store.plan import Plan, Step, connection_option, current_dialect
from mailbag.store.schema import hook_deliveries as hd
from mailbag.store.schema import hook_delivery_events as hde
from mailbag.store.schema import hook_endpoints as he
from mailbag.store.transition import EventSpec, Tracked, apply_transition
from mailbag.store.types import UTCDateTime

DELIVERY_ROWS: Tracked[DState, DAction] = Tracked(
    table=hd,
    state="status",
    machine=DELIVERIES,
    history=hde,
    subject="delivery_id",
    copied={"status_code": "last_status_code"},
    counter=("attempt", "attempts"),
)
MYSQL_CLAIMABLE_AT = literal_column("claimable_at", UTCDateTime())
CLAIM_CLEARED: dict[str, Any] = {"claim_token": None, "claimed_by": None, "lease_expires_at": None}
LEASE_EXPIRED = "lease expired before the attempt was recorded; the POST may have arrived"
DEFAULT_MAX_ATTEMPTS = 8


FAN_OUT_OPTION = "mailbag_hook_fan_out"  # the execution option that carries a FanOut


@dataclass(frozen=True)
class FanOut:
    """How a process fans events out to hook endpoints: off when HOOKS_KEY is unset. Set
    by whoever builds the process's engine, from its settings (`options()`, given to
    make_engine / make_async_engine as execution options: services.hooks.fan_out). A
    connection without it (an application's own, enqueueing or resolving through the
    Python API) fans out by default, so that no event of an endpoint that exists is lost."""

    enabled: bool = True
    max_attempts: int = DEFAULT_MAX_ATTEMPTS

    def options(self) -> dict[str, FanOut]:
        return {FAN_OUT_OPTION: self}


def fan_out_config() -> Plan[FanOut]:
    """The FanOut of the connection this plan runs on."""
    found = yield from connection_option(FAN_OUT_OPTION)
    return found if isinstance(found, FanOut) else FanOut()


# --- Fan-out ---------------------------------------------------------------------------


class OfTenant(Protocol):
    @property
    def tenant_id(self) -> str: ...


Subject = TypeVar("Subject", bound=OfTenant)

_INSERT_DELIVERY = insert(hd)


def fan_out(
    events: Sequence[tuple[HookEvent, Subject]],
    facts: Callable[[Subject], MessageFacts],
    *,
    now: datetime,
    occurred_at: datetime | None = None,
) -> Plan[int]:
    """One delivery per (event, subscribed enabled endpoint of the subject's tenant);
    returns how many. `facts` is asked only about subjects whose tenant has an endpoint,
    and each event's payload is built once for all its endpoints (same webhook-id too)."""
    if not events:
        return 0
    config = yield from fan_out_config()
    if not config.enabled:
        return 0
    tenants = sorted({subject.tenant_id for _, subject in events})
    subscribers = select(he.c.id, he.c.tenant_id, he.c.events).where(
        he.c.tenant_id.in_(tenants), he.c.enabled == true()
    )
    endpoints = (yield Step(subscribers)).all()
    if not endpoints:
        return 0
    by_tenant: dict[str, list[Row[Any]]] = {}
    for endpoint in endpoints:
        by_tenant.setdefault(endpoint.tenant_id, []).append(endpoint)
    rows: list[dict[str, Any]] = []
    for event, subject in events:
        wanted = [e for e in by_tenant.get(subject.tenant_id, ()) if f",{event.short}," in e.events]
        if not wanted:
            continue
        about = facts(subject)
        body = payload(event, about, occurred_at or now)
        webhook_id = webhook_id_for(uuid7())
        rows += [
            {
                "id": uuid7(),
                "endpoint_id": endpoint.id,
                "tenant_id": subject.tenant_id,
                "event": event.value,
                "message_id": about.message_id,
                "webhook_id": webhook_id,
                "payload": body,
                "status": DState.PENDING.value,
                "attempts": 0,
                "max_attempts": config.max_attempts,
                "next_attempt_at": now,
                "created_at": now,
                "updated_at": now,
            }
            for endpoint in wanted
        ]
    if rows:
        yield Step(_INSERT_DELIVERY, rows)
    return len(rows)


# --- Endpoints -------------------------------------------------------------------------


def _endpoint(row: Any) -> HookEndpoint:
    return HookEndpoint(
        id=row.id,
        tenant_id=row.tenant_id,
        url=row.url,
        events=events_from_column(row.events),
        enabled=bool(row.enabled),
        description=row.description,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _endpoint_scope(endpoint_id: uuid.UUID, tenant_id: str | None) -> ColumnElement[bool]:
    condition = he.c.id == endpoint_id
    return condition if tenant_id is None else and_(condition, he.c.tenant_id == tenant_id)


def create_endpoint(endpoint: HookEndpoint, sealed_secret: str) -> Plan[HookEndpoint]:
    yield Step(
        insert(he).values(
            id=endpoint.id,
            tenant_id=endpoint.tenant_id,
            url=endpoint.url,
            events=events_column(endpoint.events),
            enabled=endpoint.enabled,
            description=endpoint.description,
            secret=sealed_secret,
            created_at=endpoint.created_at,
            updated_at=endpoint.updated_at,
        )
    )
    return endpoint


def endpoint(endpoint_id: uuid.UUID, tenant_id: str | None = None) -> Plan[HookEndpoint | None]:
    row = (yield Step(select(he).where(_endpoint_scope(endpoint_id, tenant_id)))).first()
    return _endpoint(row) if row else None


def endpoints(tenant_id: str | None = None) -> Plan[list[HookEndpoint]]:
    """Oldest first; one tenant's, or everyone's."""
    query = select(he).order_by(he.c.created_at, he.c.id)
    if tenant_id is not None:
        query = query.where(he.c.tenant_id == tenant_id)
    return [_endpoint(row) for row in (yield Step(query)).all()]


def update_endpoint(
    endpoint_id: uuid.UUID,
    *,
    tenant_id: str | None,
    now: datetime,
    url: str | None = None,
    events: frozenset[HookEvent] | None = None,
    enabled: bool | None = None,
    description: str | None = None,
    sealed_secret: str | None = None,
) -> Plan[HookEndpoint | None]:
    """Change what is given; None if there is no such endpoint (in that tenant)."""
    values: dict[str, Any] = {"updated_at": now}
    if url is not None:
        values["url"] = url
    if events is not None:
        values["events"] = events_column(events)
    if enabled is not None:
        values["enabled"] = enabled
    if description is not None:
        values["description"] = description or None
    if sealed_secret is not None:
        values["secret"] = sealed_secret
    result = yield Step(update(he).where(_endpoint_scope(endpoint_id, tenant_id)).values(values))
    if not result.rowcount:  # type: ignore[attr-defined]
        return None
    return (yield from endpoint(endpoint_id))


def delete_endpoint(endpoint_id: uuid.UUID, tenant_id: str | None = None) -> Plan[bool]:
    """Remove an endpoint with its deliveries (their history goes by ON DELETE CASCADE)."""
    found = yield from endpoint(endpoint_id, tenant_id)
    if found is None:
        return False
    yield Step(delete(hd).where(hd.c.endpoint_id == endpoint_id))
    yield Step(delete(he).where(he.c.id == endpoint_id))
    return True


# --- Deliveries: the worker's side -----------------------------------------------------


_DELIVERY_FIELDS = [name for name in HookDelivery.__dataclass_fields__ if name != "url"]


def _delivery(row: Any) -> HookDelivery:
    values = row._mapping
    fields = {name: values[name] for name in _DELIVERY_FIELDS}
    fields["event"] = HookEvent(fields["event"])
    fields["status"] = DState(fields["status"])
    return HookDelivery(**fields, url=values.get("url"))


@dataclass(frozen=True)
class ClaimedDelivery:
    """A delivery taken under a lease, with what its POST needs: the endpoint's URL and
    its sealed secret (opened by the worker, never logged)."""

    delivery: HookDelivery
    url: str
    sealed_secret: str


@dataclass(frozen=True)
class HookClaim:
    token: uuid.UUID
    deliveries: list[ClaimedDelivery]


@dataclass(frozen=True)
class Fairness:
    """How a claim shares the deliverer between endpoints: at most `in_flight` deliveries of
    one endpoint in flight (counting every worker's, as of the claim), one while its
    breaker is open; a paused endpoint's deliveries are not claimed at all."""

    in_flight: int = 4
    breaker: Breaker = field(default_factory=Breaker)


# How many due rows the claim reads for each one it wants: enough to reach past an
# endpoint that has room for only a few of its many due deliveries.
CLAIM_WINDOW = 4


def claim(
    *,
    worker_id: str,
    now: datetime,
    lease: timedelta,
    limit: int,
    fairness: Fairness = Fairness(),
) -> Plan[HookClaim]:
    """Take up to `limit` due deliveries of enabled, unpaused endpoints under one claim
    token, oldest due first, each endpoint's no more than its room (`Fairness`); other
    claimers skip what this one locked (see transition.py).

    Two steps: read the head of the due queue with each endpoint's room (no lock), pick
    from it in order, then claim the picked ones under the usual guard. An endpoint that
    is full (a hanging receiver's deliveries) is left out of the head entirely, so it
    never hides the others' behind its backlog."""
    token = uuid.uuid4()
    dialect = yield from current_dialect()
    due_at = MYSQL_CLAIMABLE_AT if dialect == "mysql" else hd.c.next_attempt_at
    room = _room(fairness, now)
    head = (
        select(hd.c.id, hd.c.endpoint_id, room.c.room)
        .join(room, room.c.endpoint_id == hd.c.endpoint_id)
        .where(DELIVERY_ROWS.in_states(CLAIMABLE_DELIVERIES), due_at <= now)
        .order_by(due_at, hd.c.id)
        .limit(limit * CLAIM_WINDOW)
    )
    picked: list[uuid.UUID] = []
    taken: dict[uuid.UUID, int] = {}
    for row in (yield Step(head)).all():
        if taken.get(row.endpoint_id, 0) < row.room:
            taken[row.endpoint_id] = taken.get(row.endpoint_id, 0) + 1
            picked.append(row.id)
            if len(picked) == limit:
                break
    if not picked:
        return HookClaim(token, [])
    changed = yield from apply_transition(
        DELIVERY_ROWS,
        DAction.CLAIM,
        where=and_(hd.c.id.in_(picked), due_at <= now),
        values={"claim_token": token, "claimed_by": worker_id, "lease_expires_at": now + lease},
        now=now,
        actor=worker_id,
        order_by=(due_at, hd.c.id),
        limit=len(picked),
        skip_locked=True,
        event=EventSpec(offset=1),
    )
    if not changed:
        return HookClaim(token, [])
    deliveries = sorted((_delivery(row) for row, _ in changed), key=lambda d: d.id)
    targets = {
        row.id: row
        for row in (
            yield Step(
                select(he.c.id, he.c.url, he.c.secret).where(
                    he.c.id.in_({d.endpoint_id for d in deliveries})
                )
            )
        ).all()
    }
    return HookClaim(
        token,
        [
            ClaimedDelivery(d, targets[d.endpoint_id].url, targets[d.endpoint_id].secret)
            for d in deliveries
            if d.endpoint_id in targets  # deleted since: its rows go with it
        ],
    )


def _room(fairness: Fairness, now: datetime) -> Any:
    """Each enabled, unpaused endpoint with room for more deliveries in flight, and how
    many: its allowance (one while its breaker is open) less what is in flight now."""
    in_flight = (
        select(hd.c.endpoint_id, func.count().label("n"))
        .where(DELIVERY_ROWS.in_states({DState.PROCESSING}))  # the leased rows' index
        .group_by(hd.c.endpoint_id)
        .subquery("in_flight")
    )
    allowance = case(
        (he.c.failures_in_row >= fairness.breaker.failures, 1), else_=fairness.in_flight
    )
    room = (allowance - func.coalesce(in_flight.c.n, 0)).label("room")
    return (
        select(he.c.id.label("endpoint_id"), room)
        .select_from(he.outerjoin(in_flight, in_flight.c.endpoint_id == he.c.id))
        .where(
            he.c.enabled == true(),
            or_(he.c.paused_until.is_(None), he.c.paused_until <= now),
            room > 0,
        )
        .subquery("room")
    )


@dataclass(frozen=True)
class Attempted:
    """What became of one claimed delivery: DELIVER, RETRY (at `next_attempt_at`), BURY,
    or RELEASE (no POST made: no attempt spent)."""

    delivery_id: uuid.UUID
    action: DAction
    status_code: int | None = None
    error: str | None = None
    next_attempt_at: datetime | None = None


FINALIZE_ACTIONS = frozenset({DAction.DELIVER, DAction.RETRY, DAction.BURY, DAction.RELEASE})


def finalize(
    *, token: uuid.UUID, results: Sequence[Attempted], now: datetime, actor: str
) -> Plan[list[HookDelivery]]:
    """Record each attempt where the claim is still `token`'s; return the deliveries
    changed (one swept and claimed again by another worker meanwhile is left alone)."""
    done: list[HookDelivery] = []
    for result in results:
        if result.action not in FINALIZE_ACTIONS:
            raise ValueError(f"{result.action} is not a finalize action")
        values: dict[str, Any] = {**CLAIM_CLEARED}
        if result.action is not DAction.RELEASE:
            values |= {
                "attempts": hd.c.attempts + 1,
                "last_status_code": result.status_code,
                "last_error": truncate_error(result.error),
            }
        if result.action is DAction.DELIVER:
            values["delivered_at"] = now
        if result.next_attempt_at is not None:
            values["next_attempt_at"] = result.next_attempt_at
        changed = yield from apply_transition(
            DELIVERY_ROWS,
            result.action,
            where=and_(hd.c.id == result.delivery_id, hd.c.claim_token == token),
            values=values,
            now=now,
            actor=actor,
            event=(
                EventSpec(offset=1, text="released unposted; no attempt spent")
                if result.action is DAction.RELEASE
                else EventSpec(column="last_error")
            ),
        )
        done += [_delivery(row) for row, _ in changed]
    return done


@dataclass(frozen=True)
class Settled:
    """A batch recorded (`settle`): the deliveries changed, and the endpoints whose breaker
    that batch opened (or kept open), with the time they wait until."""

    deliveries: list[HookDelivery]
    paused: dict[uuid.UUID, datetime]


def settle(
    *,
    token: uuid.UUID,
    results: Sequence[Attempted],
    now: datetime,
    actor: str,
    breaker: Breaker,
) -> Plan[Settled]:
    """`finalize`, and each endpoint's breaker moved by what its attempts did, in the same
    transaction."""
    done = yield from finalize(token=token, results=results, now=now, actor=actor)
    delivered: set[uuid.UUID] = set()
    failed: dict[uuid.UUID, int] = {}
    actions = {result.delivery_id: result.action for result in results}
    for delivery in done:
        action = actions[delivery.id]
        if action is DAction.DELIVER:
            delivered.add(delivery.endpoint_id)
        elif action in (DAction.RETRY, DAction.BURY):
            failed[delivery.endpoint_id] = failed.get(delivery.endpoint_id, 0) + 1
    paused = yield from record_endpoint_outcomes(delivered, failed, now=now, breaker=breaker)
    return Settled(done, paused)


def record_endpoint_outcomes(
    delivered: set[uuid.UUID],
    failed: dict[uuid.UUID, int],
    *,
    now: datetime,
    breaker: Breaker,
) -> Plan[dict[uuid.UUID, datetime]]:
    """An endpoint that answered 2xx closes its breaker; one whose attempts all failed adds
    them to its failures in a row, and pauses once the breaker says so. Returns the paused
    endpoints. A healthy endpoint's row is not written (the UPDATE's guard is false), so
    busy endpoints cost no write and no lock here."""
    if delivered:
        yield Step(
            update(he)
            .where(
                he.c.id.in_(sorted(delivered)),
                or_(he.c.failures_in_row != 0, he.c.paused_until.is_not(None)),
            )
            .values(failures_in_row=0, paused_until=None)
        )
    paused: dict[uuid.UUID, datetime] = {}
    for endpoint_id, count in sorted(failed.items()):
        if endpoint_id in delivered:
            continue  # it answered within this batch: not failing in a row
        yield Step(
            update(he)
            .where(he.c.id == endpoint_id)
            .values(failures_in_row=he.c.failures_in_row + count)
        )
        # The endpoint exists: its delivery was just claimed.
        failures = (
            yield Step(select(he.c.failures_in_row).where(he.c.id == endpoint_id))
        ).scalar_one()
        pause = breaker.pause(failures)
        if pause is not None:
            paused[endpoint_id] = now + pause
            yield Step(update(he).where(he.c.id == endpoint_id).values(paused_until=now + pause))
    return paused


def sweep(*, now: datetime, actor: str, limit: int = 1000) -> Plan[list[HookDelivery]]:
    """Deliveries whose lease ran out (their worker died or hung mid-POST) go back to
    `retrying`, due now: the POST may have arrived, so the receiver may see it twice, with
    the same webhook-id. The attempt counts, and the last one the budget allows ends the
    delivery `dead` (domain.hooks.DELIVERIES: EXPIRE's two targets), so a delivery that
    kills its worker every time stops at HOOK_MAX_ATTEMPTS."""
    dialect = yield from current_dialect()
    changed = yield from apply_transition(
        DELIVERY_ROWS,
        DAction.EXPIRE,
        where=hd.c.lease_expires_at < now,
        values={
            **CLAIM_CLEARED,
            "attempts": hd.c.attempts + 1,
            "next_attempt_at": now,
            "last_status_code": None,
            "last_error": LEASE_EXPIRED,
        },
        now=now,
        actor=actor,
        order_by=(hd.c.lease_expires_at,),
        limit=limit,
        skip_locked=dialect != "sqlite",
        event=EventSpec(text=LEASE_EXPIRED),
    )
    return [_delivery(row) for row, _ in changed]


# --- Deliveries: the operators' side ---------------------------------------------------


def _delivery_scope(delivery_id: uuid.UUID, tenant_id: str | None) -> ColumnElement[bool]:
    condition = hd.c.id == delivery_id
    return condition if tenant_id is None else and_(condition, hd.c.tenant_id == tenant_id)


def _with_url() -> Any:
    return select(hd, he.c.url).select_from(hd.outerjoin(he, he.c.id == hd.c.endpoint_id))


def delivery(
    delivery_id: uuid.UUID, tenant_id: str | None = None
) -> Plan[tuple[HookDelivery, list[DeliveryEvent]] | None]:
    """A delivery and its history, oldest move first."""
    row = (yield Step(_with_url().where(_delivery_scope(delivery_id, tenant_id)))).first()
    if row is None:
        return None
    moves = (
        yield Step(select(hde).where(hde.c.delivery_id == delivery_id).order_by(hde.c.id))
    ).all()
    history = [
        DeliveryEvent(
            id=m.id,
            delivery_id=m.delivery_id,
            from_status=DState(m.from_status) if m.from_status else None,
            to_status=DState(m.to_status),
            at=m.at,
            actor=m.actor,
            attempt=m.attempt,
            status_code=m.status_code,
            detail=m.detail,
        )
        for m in moves
    ]
    return _delivery(row), history


@dataclass(frozen=True)
class DeliveryQuery:
    tenant_id: str | None = None
    endpoint_id: uuid.UUID | None = None
    status: DState | None = None
    event: HookEvent | None = None
    message_id: uuid.UUID | None = None


def encode_cursor(d: HookDelivery) -> str:
    text = f"{d.created_at.isoformat()}|{d.id.hex}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """ValueError when the cursor is not one `encode_cursor` made."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, hex_id = text.partition("|")
        created_at = datetime.fromisoformat(at)
        if created_at.tzinfo is None:
            raise ValueError("naive")
        return created_at, uuid.UUID(hex=hex_id)
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise ValueError("not a cursor of this listing") from exc


def page(
    query: DeliveryQuery, *, limit: int, after: tuple[datetime, uuid.UUID] | None = None
) -> Plan[tuple[list[HookDelivery], bool]]:
    """Deliveries newest first, `limit` of them after the cursor; and whether more follow."""
    conditions: list[ColumnElement[bool]] = []
    if query.tenant_id is not None:
        conditions.append(hd.c.tenant_id == query.tenant_id)
    if query.endpoint_id is not None:
        conditions.append(hd.c.endpoint_id == query.endpoint_id)
    if query.status is not None:
        conditions.append(hd.c.status == query.status.value)
    if query.event is not None:
        conditions.append(hd.c.event == query.event.value)
    if query.message_id is not None:
        conditions.append(hd.c.message_id == query.message_id)
    if after is not None:
        at, last_id = after
        conditions.append(or_(hd.c.created_at < at, and_(hd.c.created_at == at, hd.c.id < last_id)))
    statement = (
        _with_url()
        .where(and_(true(), *conditions))
        .order_by(hd.c.created_at.desc(), hd.c.id.desc())
        .limit(limit + 1)
    )
    rows = (yield Step(statement)).all()
    return [_delivery(row) for row in rows[:limit]], len(rows) > limit


def replay(
    delivery_id: uuid.UUID,
    *,
    tenant_id: str | None,
    now: datetime,
    actor: str,
    extra_attempts: int,
) -> Plan[HookDelivery | None]:
    """A delivered or dead delivery goes out again: same webhook-id and body, due now, a
    fresh budget (attempt numbers keep counting, so max = done + extra). None if it is
    not in a state to replay (or does not exist)."""
    changed = yield from apply_transition(
        DELIVERY_ROWS,
        DAction.REPLAY,
        where=_delivery_scope(delivery_id, tenant_id),
        values={
            "next_attempt_at": now,
            "max_attempts": hd.c.attempts + extra_attempts,
            "delivered_at": None,
            **CLAIM_CLEARED,
        },
        now=now,
        actor=actor,
        event=EventSpec(text="replayed by an operator"),
    )
    return _delivery(changed[0][0]) if changed else None
