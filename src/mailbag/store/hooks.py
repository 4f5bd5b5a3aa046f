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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from sqlalchemy import (
    ColumnElement,
    Integer,
    Row,
    Select,
    and_,
    any_,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

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
from mailbag.store.per_row import PerRow
from mailbag.store.plan import (
    Plan,
    Step,
    Together,
    connection_option,
    current_dialect,
    together,
)
from mailbag.store.schema import hook_deliveries as hd
from mailbag.store.schema import hook_delivery_events as hde
from mailbag.store.schema import hook_endpoints as he
from mailbag.store.transition import NOW, EventSpec, Tracked, apply_transition
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


def _array(name: str, type_: Any) -> ColumnElement[Any]:
    """A PostgreSQL array parameter of `type_`, bound by `name`: one parameter for a list of
    values, so the statement is the same for every list (an IN list is not)."""
    return cast(bindparam(name, type_=ARRAY(type_)), ARRAY(type_))


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
T = TypeVar("T")

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
    from it in order, then claim the picked ones under the usual guard (with their
    endpoints' URLs and secrets beside, in the same round trip on PostgreSQL). An endpoint
    that is full (a hanging receiver's deliveries) is left out of the head entirely, so it
    never hides the others' behind its backlog."""
    dialect = yield from current_dialect()
    head = yield _head(dialect, fairness, now=now, limit=limit)
    return (yield from _take(head.all(), worker_id=worker_id, now=now, lease=lease, limit=limit))


def _take(
    head: Sequence[Row[Any]], *, worker_id: str, now: datetime, lease: timedelta, limit: int
) -> Plan[HookClaim]:
    """Claim what the head (`_head`) lets through: the last step of `claim`."""
    token = uuid.uuid4()
    picked: list[uuid.UUID] = []
    taken: dict[uuid.UUID, int] = {}
    for row in head:
        if taken.get(row.endpoint_id, 0) < row.room:
            taken[row.endpoint_id] = taken.get(row.endpoint_id, 0) + 1
            picked.append(row.id)
            if len(picked) == limit:
                break
    if not picked:
        return HookClaim(token, [])
    dialect = yield from current_dialect()
    due_at = MYSQL_CLAIMABLE_AT if dialect == "mysql" else hd.c.next_attempt_at
    claim_values = {"claim_token": token, "claimed_by": worker_id, "lease_expires_at": now + lease}
    if dialect == "postgresql":  # one statement, built once: every value a named parameter
        where, values = and_(hd.c.id == any_(_array("ids", hd.c.id.type)), due_at <= NOW), _CLAIM
        params: dict[str, Any] | None = {"ids": picked, **claim_values}
        # No LIMIT: the ids bound it (and a LIMIT would be frozen into the statement); locked
        # in their key's order, found by it: ordered by due time, the planner walked the
        # claim index past every due row to find these few.
        order_by: tuple[ColumnElement[Any], ...] = (hd.c.id,)
        limit_, cache = None, "claim"
    else:
        where, values = and_(hd.c.id.in_(picked), due_at <= now), claim_values
        order_by, params, limit_, cache = (due_at, hd.c.id), None, len(picked), None
    changed, targets = yield from _abreast(
        apply_transition(
            DELIVERY_ROWS,
            DAction.CLAIM,
            where=where,
            values=values,
            now=now,
            actor=worker_id,
            order_by=order_by,
            limit=limit_,
            skip_locked=True,
            event=EventSpec(offset=1),
            cache=cache,
            params=params,
        ),
        _step(_targets(dialect, sorted(taken))),
        last=True,
    )
    found = {row.id: row for row in targets.all()}
    deliveries = sorted((_delivery(row) for row, _ in changed), key=lambda d: d.id)
    return HookClaim(
        token,
        [
            ClaimedDelivery(d, found[d.endpoint_id].url, found[d.endpoint_id].secret)
            for d in deliveries
            if d.endpoint_id in found  # deleted since: its rows go with it
        ],
    )


# The claim's values on PostgreSQL, where its statement is cached (`_take`).
_CLAIM: dict[str, Any] = {
    "claim_token": bindparam("claim_token", type_=hd.c.claim_token.type),
    "claimed_by": bindparam("claimed_by", type_=hd.c.claimed_by.type),
    "lease_expires_at": bindparam("lease_expires_at", type_=UTCDateTime()),
}
_ENDPOINTS_BY_ID = select(he.c.id, he.c.url, he.c.secret).where(
    he.c.id == any_(_array("ids", he.c.id.type))
)


def _targets(dialect: str, endpoint_ids: list[uuid.UUID]) -> Step:
    """The URL and sealed secret of each of these endpoints."""
    if dialect == "postgresql":  # built once, sent with the claim (an array: not expanded)
        return Step(_ENDPOINTS_BY_ID, {"ids": endpoint_ids})
    return Step(select(he.c.id, he.c.url, he.c.secret).where(he.c.id.in_(endpoint_ids)))


_HEADS: dict[tuple[str, Fairness], Any] = {}


def _head(dialect: str, fairness: Fairness, *, now: datetime, limit: int) -> Step:
    """The head of the due queue, `limit * CLAIM_WINDOW` rows, with each endpoint's room:
    built once per database and Fairness, its time (`now`) and length (`window`) bound.

    On PostgreSQL the rooms are worked out first (a MATERIALIZED CTE: a few rows), and the
    due rows are read in the claim index's order, only those of endpoints with room (an
    array of them, computed once), until the window is full; the window is no longer than
    the room there is (x CLAIM_WINDOW). A join of the due rows with the rooms, left to the
    planner on a young table's statistics, read and sorted every due row each time: 2-7 ms
    for 3,000 of them. Elsewhere the rooms are joined."""
    statement = _HEADS.get((dialect, fairness))
    if statement is not None:
        return Step(statement, {"now": now, "window": limit * CLAIM_WINDOW})
    due_at = MYSQL_CLAIMABLE_AT if dialect == "mysql" else hd.c.next_attempt_at
    window: ColumnElement[Any] = bindparam("window", type_=Integer())
    due = and_(DELIVERY_ROWS.in_states(CLAIMABLE_DELIVERIES), due_at <= NOW)
    if dialect == "postgresql":
        room = _room(fairness, NOW).cte("room").prefix_with("MATERIALIZED")
        with_room = select(func.array_agg(room.c.endpoint_id)).scalar_subquery()
        rooms = select(func.coalesce(func.sum(room.c.room), 0)).scalar_subquery()
        its_room = select(room.c.room).where(room.c.endpoint_id == hd.c.endpoint_id)
        statement = (
            select(hd.c.id, hd.c.endpoint_id, its_room.scalar_subquery().label("room"))
            .where(due, hd.c.endpoint_id == any_(cast(with_room, ARRAY(hd.c.endpoint_id.type))))
            .order_by(due_at, hd.c.id)
            .limit(func.least(window, rooms * CLAIM_WINDOW))
        )
    else:
        room = _room(fairness, NOW).cte("room")
        statement = (
            select(hd.c.id, hd.c.endpoint_id, room.c.room)
            .join(room, room.c.endpoint_id == hd.c.endpoint_id)
            .where(due)
            .order_by(due_at, hd.c.id)
            .limit(window)
        )
    _HEADS[(dialect, fairness)] = statement
    return Step(statement, {"now": now, "window": limit * CLAIM_WINDOW})


def _room(fairness: Fairness, now: ColumnElement[Any]) -> Select[Any]:
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
RELEASED = EventSpec(offset=1, text="released unposted; no attempt spent")
ATTEMPTED = EventSpec(column="last_error")


def finalize(
    *, token: uuid.UUID, results: Sequence[Attempted], now: datetime, actor: str
) -> Plan[list[HookDelivery]]:
    """Record each attempt where the claim is still `token`'s; return the deliveries
    changed (one swept and claimed again by another worker meanwhile is left alone)."""
    return (yield from finalize_claims({token: results}, now=now, actor=actor))


def finalize_claims(
    claims: Mapping[uuid.UUID, Sequence[Attempted]], *, now: datetime, actor: str
) -> Plan[list[HookDelivery]]:
    """`finalize` for the attempts of several claims (by claim token) at once: one UPDATE
    for each kind of outcome, however many deliveries and claims, each row guarded by its
    own claim's token and given its own status code, error and due time (store.per_row.PerRow)."""
    by_action: dict[DAction, list[tuple[uuid.UUID, Attempted]]] = {}
    for token, results in claims.items():
        for result in results:
            if result.action not in FINALIZE_ACTIONS:
                raise ValueError(f"{result.action} is not a finalize action")
            by_action.setdefault(result.action, []).append((token, result))
    dialect = yield from current_dialect()
    done: list[HookDelivery] = []
    for action in sorted(by_action):  # one order for every worker: no lock-order deadlock
        group = by_action[action]
        rows = PerRow(
            [result.delivery_id for _, result in group],
            hd.c.id,
            arrays=dialect == "postgresql",
            now=now,
        )
        values: dict[str, Any] = {**CLAIM_CLEARED}
        if action is not DAction.RELEASE:
            values |= {
                "attempts": hd.c.attempts + 1,
                "last_status_code": rows.value(
                    "status_code", [r.status_code for _, r in group], hd.c.last_status_code.type
                ),
                "last_error": rows.value(
                    "last_error", [truncate_error(r.error) for _, r in group], hd.c.last_error.type
                ),
            }
        if action is DAction.DELIVER:
            values["delivered_at"] = rows.now
        due = [r.next_attempt_at for _, r in group]
        if any(at is not None for at in due):
            values["next_attempt_at"] = rows.value(
                "next_attempt_at", due, UTCDateTime(), keep=hd.c.next_attempt_at
            )
        ours = hd.c.claim_token == rows.value(
            "claim_token", [token for token, _ in group], hd.c.claim_token.type
        )
        changed = yield from apply_transition(
            DELIVERY_ROWS,
            action,
            where=and_(rows.match(), ours),
            values=values,
            now=now,
            actor=actor,
            event=RELEASED if action is DAction.RELEASE else ATTEMPTED,
            cache=("finalize", "next_attempt_at" in values) if rows.arrays else None,
            params=rows.params,
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
    return (yield from settle_claims({token: results}, now=now, actor=actor, breaker=breaker))


def settle_claims(
    claims: Mapping[uuid.UUID, Sequence[Attempted]],
    *,
    now: datetime,
    actor: str,
    breaker: Breaker,
) -> Plan[Settled]:
    """`settle` for the attempts of several claims (by claim token) at once."""
    done = yield from finalize_claims(claims, now=now, actor=actor)
    dialect = yield from current_dialect()
    yield from _step(_close_breakers(dialect, claims))
    paused = yield from _count_failures(claims, done, now=now, breaker=breaker)
    return Settled(done, paused)


def _delivered(claims: Mapping[uuid.UUID, Sequence[Attempted]]) -> list[uuid.UUID]:
    return sorted(
        r.delivery_id for rs in claims.values() for r in rs if r.action is DAction.DELIVER
    )


def _failing(claims: Mapping[uuid.UUID, Sequence[Attempted]]) -> bool:
    return any(r.action in FAILED for results in claims.values() for r in results)


FAILED = frozenset({DAction.RETRY, DAction.BURY})


def _close_breakers(dialect: str, claims: Mapping[uuid.UUID, Sequence[Attempted]]) -> Step | None:
    """An endpoint that answered 2xx closes its breaker: those of these deliveries that are
    delivered now (whoever recorded it). It needs nothing the outcomes' statement returns,
    so it can go in the same round trip. A healthy endpoint's row is not written (the
    UPDATE's guard is false), so busy endpoints cost no write and no lock here."""
    ids = _delivered(claims)
    if not ids:
        return None
    if dialect == "postgresql":  # built once (an array: not expanded, so it can be pipelined)
        return Step(_CLOSE_BREAKERS, {"ids": ids})
    return Step(_closing(hd.c.id.in_(ids)))


def _closing(deliveries: ColumnElement[bool]) -> Any:
    delivered = select(hd.c.endpoint_id).where(
        deliveries, DELIVERY_ROWS.in_states({DState.DELIVERED})
    )
    return (
        update(he)
        .where(
            he.c.id.in_(delivered),
            or_(he.c.failures_in_row != 0, he.c.paused_until.is_not(None)),
        )
        .values(failures_in_row=0, paused_until=None)
    )


_CLOSE_BREAKERS = _closing(hd.c.id == any_(_array("ids", hd.c.id.type)))


def _count_failures(
    claims: Mapping[uuid.UUID, Sequence[Attempted]],
    done: Sequence[HookDelivery],
    *,
    now: datetime,
    breaker: Breaker,
) -> Plan[dict[uuid.UUID, datetime]]:
    """An endpoint whose recorded attempts all failed adds them to its failures in a row,
    and pauses once the breaker says so. Returns the paused endpoints."""
    actions = {r.delivery_id: r.action for results in claims.values() for r in results}
    delivered = {d.endpoint_id for d in done if actions[d.id] is DAction.DELIVER}
    failed: dict[uuid.UUID, int] = {}
    for delivery in done:
        if actions[delivery.id] in FAILED and delivery.endpoint_id not in delivered:
            # (One that answered within this batch is not failing in a row.)
            failed[delivery.endpoint_id] = failed.get(delivery.endpoint_id, 0) + 1
    paused: dict[uuid.UUID, datetime] = {}
    for endpoint_id, count in sorted(failed.items()):
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


# --- The deliverer's turn ------------------------------------------------------------------


def turn(
    claims: Mapping[uuid.UUID, Sequence[Attempted]],
    *,
    worker_id: str,
    now: datetime,
    lease: timedelta,
    limit: int,
    fairness: Fairness = Fairness(),
) -> Plan[tuple[Settled, HookClaim]]:
    """The deliverer's transaction: record the attempts of these claims that finished
    (`settle_claims`), then claim up to `limit` more (`claim`); the claim sees the room
    the recording made (a finished delivery counts in flight until it is recorded).

    On PostgreSQL, when none of them failed, two round trips (AsyncDatabase.run_at_once
    pipelines them, BEGIN and COMMIT included): the outcomes, the breakers they close and
    the head of the queue; then the claim with its endpoints. A failure moves its
    endpoint's breaker from what the outcomes returned, which takes round trips of its
    own before the head is read, so that a breaker it opens keeps the claim away."""
    dialect = yield from current_dialect()
    if dialect == "postgresql" and not _failing(claims):
        plans: list[Plan[Any]] = []
        if claims:
            plans += [finalize_claims(claims, now=now, actor=worker_id)]
            plans += [_step(_close_breakers(dialect, claims))]
        if limit > 0:
            plans += [_step(_head(dialect, fairness, now=now, limit=limit))]
        # The COMMIT goes along when nothing follows: no claim, one statement of outcomes.
        alone = limit == 0 and len({r.action for rs in claims.values() for r in rs}) <= 1
        answers = yield from _abreast(*plans, last=alone)
        settled = Settled(answers[0] if claims else [], {})
        head = answers[-1].all() if limit > 0 else []
    else:
        settled = yield from settle_claims(
            claims, now=now, actor=worker_id, breaker=fairness.breaker
        )
        head = (yield _head(dialect, fairness, now=now, limit=limit)).all() if limit > 0 else []
    claimed = yield from _take(head, worker_id=worker_id, now=now, lease=lease, limit=limit)
    return settled, claimed


def _step(step: Step | None) -> Plan[Any]:
    """One step as a plan (nothing, for None)."""
    if step is None:
        return None
    return (yield step)


def _abreast(*plans: Plan[Any], last: bool = False) -> Plan[list[Any]]:
    """What `plans` return, run side by side. On PostgreSQL each runs to its first SQL
    step, and those steps go together (one round trip under run_at_once; `last`: nothing
    follows, the COMMIT goes with them), in order; what a plan yields after its first
    step follows one plan after the other (so give `last` only for one-step plans).
    Elsewhere one plan after the other: their steps there are several, and a later plan
    may need to see what an earlier one wrote."""
    dialect = yield from current_dialect()
    answers: list[Any] = [None] * len(plans)
    if dialect != "postgresql":
        for i, plan in enumerate(plans):
            answers[i] = yield from plan
        return answers
    started: list[tuple[int, Plan[Any], Step]] = []
    for i, plan in enumerate(plans):
        try:
            instruction = next(plan)
            while not isinstance(instruction, Step | Together):  # a question: the runner's
                instruction = plan.send((yield instruction))
        except StopIteration as done:
            answers[i] = done.value
            continue
        if isinstance(instruction, Together):
            raise ValueError("a plan run abreast starts with a single step")
        started.append((i, plan, instruction))
    if not started:
        return answers
    results = yield from together(*(step for _, _, step in started), last=last)
    for (i, plan, _), result in zip(started, results, strict=True):
        answers[i] = yield from _resume(plan, result)
    return answers


def _resume(plan: Plan[T], answer: Any) -> Plan[T]:
    """The rest of a plan that is waiting for `answer`."""
    try:
        instruction = plan.send(answer)
        while True:
            instruction = plan.send((yield instruction))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


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
