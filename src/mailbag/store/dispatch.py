"""The worker's operations: claim under a lease, extend it, finalize, sweep what expired.

Nothing here holds a transaction across provider I/O: the worker claims, commits, sends,
then finalizes in a new transaction. Finalizes are guarded by the claim token.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    and_,
    bindparam,
    case,
    func,
    literal,
    select,
    update,
)

from mailbag.domain.content import HEAD_START, Priority, head_start
from mailbag.domain.delivery import Decision
from mailbag.domain.message import Message, truncate_error
from mailbag.domain.states import Action, Status
from mailbag.store import attachments
from mailbag.store.fair import LANES, MYSQL_CLAIMABLE_AT
from mailbag.store.message_transitions import (
    CLAIM_CLEARED,
    LAST_ERROR,
    Changed,
    Settled,
    message_from_row,
    om,
    settled_from_row,
    transition,
)
from mailbag.store.per_row import PerRow
from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.schema import message_events
from mailbag.store.transition import NOW, EventSpec
from mailbag.store.types import UTCDateTime

UNCONFIRMED_CLAIM = "claimed, but the worker never heard so: released unsent; no attempt spent"
LEASE_EXPIRED = "lease expired before the send was finalized; the provider may have accepted it"


@dataclass(frozen=True)
class Claim:
    token: uuid.UUID
    messages: list[Message]


@dataclass(frozen=True)
class Finalized:
    changed: list[Changed[Settled]]
    stale: list[uuid.UUID] = field(default_factory=list)  # the claim was no longer ours


FINALIZE_ACTIONS = frozenset(
    {
        Action.MARK_SENT,
        Action.RETRY,
        Action.FAIL,
        Action.BURY,
        Action.MARK_UNKNOWN,
        Action.RELEASE,
        Action.LAPSE,
    }
)
# Finalized without a send: no attempt is spent.
_UNSENT = frozenset({Action.RELEASE, Action.LAPSE})

_FINALIZE_EVENTS: dict[Action, EventSpec] = {
    # A provider that took the message for some recipients only says which it refused.
    Action.MARK_SENT: LAST_ERROR,
    Action.RELEASE: EventSpec(offset=1, text="released unsent; no attempt spent"),
}
# A release that waits (for its provider, for its recipient domain's slot) says why, and
# that it cost no attempt.
WAITING = EventSpec(offset=1, column="last_error", suffix=" (waits; no attempt spent)")


# The claim's parameters on PostgreSQL (its statement is cached: see `claim`).
_DUE_BY = bindparam("due_by", type_=UTCDateTime())
_CLAIM_BINDS = {
    "claim_token": bindparam("claim_token", type_=om.c.claim_token.type),
    "claimed_by": bindparam("claimed_by", type_=om.c.claimed_by.type),
    "claimed_at": NOW,
    "lease_expires_at": bindparam("lease_expires_at", type_=UTCDateTime()),
}


def claim(
    *,
    worker_id: str,
    now: datetime,
    lease: timedelta,
    limit: int,
    token: uuid.UUID | None = None,
    paused_tenants: frozenset[str] = frozenset(),
) -> Plan[Claim]:
    """Take up to `limit` due messages under one fresh claim token, shared fairly among
    the lanes with due mail (store/fair.py: each tenant's transactional mail, and its bulk
    mail), each lane in claim order: due time less the priority's head start
    (content.HEAD_START), so higher priority goes first without starving the rest. Their
    attachments come along (references, not bytes). Messages of `paused_tenants` (an
    operator's pause) are left where they are.

    Every due message has claim_order_at <= now + HEAD_START (the lowest priority's head
    start is -HEAD_START), which bounds the claim index's range; next_attempt_at <= now
    keeps the not-yet-due high-priority messages in that range out.
    """
    token = token or uuid.uuid4()
    dialect = yield from current_dialect()
    order_at = MYSQL_CLAIMABLE_AT if dialect == "mysql" else om.c.claim_order_at
    claim_values: dict[str, Any] = {
        "claim_token": token,
        "claimed_by": worker_id,
        "claimed_at": now,
        "lease_expires_at": now + lease,
    }
    if dialect == "postgresql":
        # One statement per limit, built once: every value is a named parameter.
        due = and_(order_at <= _DUE_BY, om.c.next_attempt_at <= NOW)
        values: dict[str, Any] = {name: _CLAIM_BINDS[name] for name in claim_values}
        params = {**claim_values, "due_by": now + HEAD_START}
    else:
        due = and_(order_at <= now + HEAD_START, om.c.next_attempt_at <= now)
        values, params = claim_values, {}
    if paused_tenants:  # rare: a statement of its own for each set of paused tenants
        due = and_(due, om.c.tenant_id.not_in(sorted(paused_tenants)))
    changed = yield from transition(
        Action.CLAIM,
        as_row=message_from_row,
        where=due,
        values=values,
        now=now,
        actor=worker_id,
        limit=limit,  # in each lane's claim order (order_at, id): see store/fair.py
        skip_locked=True,
        event=EventSpec(offset=1),
        cache=("claim", limit, tuple(sorted(paused_tenants))),
        params=params,
        candidates=LANES,
    )
    # Transactional mail first: a worker that cannot start them all at once starts those.
    claimed = sorted((c.message for c in changed), key=lambda m: (m.bulk, m.claim_order_at, m.id))
    return Claim(token, (yield from attachments.attached(claimed)))


def release_unconfirmed(
    *, tokens: Sequence[uuid.UUID], now: datetime, actor: str
) -> Plan[list[Changed[Settled]]]:
    """Hand back, unsent and with no attempt spent, what claims under `tokens` still hold:
    claims whose COMMIT went through while their worker heard an error, so the worker never
    had those messages and nobody sent them. A row swept since is `unknown`, left alone."""
    if not tokens:
        return []
    return (
        yield from transition(
            Action.RELEASE,
            as_row=settled_from_row,
            where=om.c.claim_token.in_(tokens),
            values=dict(CLAIM_CLEARED),
            now=now,
            actor=actor,
            event=EventSpec(offset=1, text=UNCONFIRMED_CLAIM),
        )
    )


def extend_lease(
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
    *,
    token: uuid.UUID,
    decisions: Mapping[uuid.UUID, Decision],
    now: datetime,
    actor: str,
    provider: str | None = None,
) -> Plan[Finalized]:
    """Record what the worker decided about claimed messages (by message id), only where the
    claim is still ours.

    The changed rows come back as `Settled` summaries: a worker finalizes thousands of
    messages a second and needs none of their template data.

    Decisions are grouped so that a batch costs one UPDATE per kind of decision, however many
    messages it holds. A row whose token no longer matches (the lease expired and was swept,
    or another worker holds it now) is left alone and reported as stale.
    """
    groups: dict[tuple[Action, bool, bool], dict[uuid.UUID, Decision]] = defaultdict(dict)
    for message_id, decision in decisions.items():
        if decision.action not in FINALIZE_ACTIONS:
            raise ValueError(f"{decision.action} is not a finalize action")
        # A release that waits (for a provider) sets when it is due again; one that does
        # not leaves it due at once.
        waits = decision.action is Action.RELEASE and decision.next_attempt_at is not None
        groups[(decision.action, decision.keep_attempt, waits)][message_id] = decision

    dialect = yield from current_dialect()
    changed: list[Changed[Settled]] = []
    for (action, keep_attempt, waits), group in groups.items():
        rows = PerRow(list(group), om.c.id, arrays=dialect == "postgresql", now=now)
        values = _finalize_values(action, keep_attempt, waits, group, now, provider, rows)
        ours = om.c.claim_token == rows.bind("token", token, om.c.claim_token.type)
        changed += yield from transition(
            action,
            as_row=settled_from_row,
            where=and_(rows.match(), ours),
            values=values,
            now=now,
            actor=actor,
            event=WAITING
            if waits
            else _FINALIZE_EVENTS.get(action)
            or (EventSpec(offset=1, column="last_error") if keep_attempt else LAST_ERROR),
            # On PostgreSQL every value is a named parameter (PerRow): one statement per
            # kind of decision, built once.
            cache=("finalize", action, keep_attempt, waits) if rows.arrays else None,
            params=rows.params,
        )
    done = {c.message.id for c in changed}
    return Finalized(changed, [message_id for message_id in decisions if message_id not in done])


def _finalize_values(
    action: Action,
    keep_attempt: bool,
    waits: bool,
    group: Mapping[uuid.UUID, Decision],
    now: datetime,
    provider: str | None,
    rows: PerRow,
) -> dict[str, Any]:
    spends_attempt = action not in _UNSENT and not keep_attempt
    values: dict[str, Any] = {
        **CLAIM_CLEARED,
        "attempt_count": om.c.attempt_count + (1 if spends_attempt else 0),
    }
    if action is Action.RELEASE:
        if waits:  # handed back until its provider may take it: due then, not at once
            _due_at(values, [d.next_attempt_at or now for d in group.values()], rows)
            values["last_error"] = rows.value(
                "last_error",
                [truncate_error(d.error) for d in group.values()],
                om.c.last_error.type,
            )
        return values
    errors = [truncate_error(d.error) for d in group.values()]
    last_error = rows.value("last_error", errors, om.c.last_error.type)
    if action is Action.LAPSE:
        values.update(last_error=last_error, ambiguous_since=None)
        return values
    # Each decision may name the provider that made it (routes: one of several).
    providers = [d.provider or provider for d in group.values()]
    values["provider"] = rows.value("provider", providers, om.c.provider.type)
    provider_ids = [d.provider_message_id for d in group.values()]
    kept_provider_id = om.c.provider_message_id
    if action is Action.MARK_SENT:
        values.update(
            sent_at=rows.now,
            ambiguous_since=None,
            last_error=last_error,
            provider_message_id=rows.value(
                "provider_message_id", provider_ids, kept_provider_id.type, kept_provider_id
            ),
        )
        return values
    values["last_error"] = last_error
    if action is Action.MARK_UNKNOWN:
        values["provider_message_id"] = rows.value(
            "provider_message_id", provider_ids, kept_provider_id.type, kept_provider_id
        )
    if action is Action.RETRY:
        _due_at(values, [d.next_attempt_at or now for d in group.values()], rows)
        since = [d.ambiguous_since for d in group.values()]
        values["ambiguous_since"] = (
            rows.value("ambiguous_since", since, UTCDateTime()) if keep_attempt else None
        )
    elif action is not Action.MARK_UNKNOWN:
        values["ambiguous_since"] = None
    return values


def _due_at(values: dict[str, Any], next_at: list[datetime], rows: PerRow) -> None:
    values["next_attempt_at"] = rows.value("next_attempt_at", next_at, UTCDateTime())
    values["claim_order_at"] = claim_order(next_at, rows)


def claim_order(
    due: datetime | Sequence[datetime], rows: PerRow | None = None
) -> ColumnElement[Any]:
    """claim_order_at for rows becoming due at `due` (one time, or one per row of `rows`):
    that time less each row's own priority's head start, in the same UPDATE."""
    by_level = {
        level: (
            literal(due - head_start(level), UTCDateTime())
            if isinstance(due, datetime)
            else _rows(rows).value(
                f"claim_order_{level.name.lower()}",
                [at - head_start(level) for at in due],
                UTCDateTime(),
            )
        )
        for level in Priority
    }
    normal = by_level.pop(Priority.NORMAL)
    return case(
        {int(level): value for level, value in by_level.items()}, value=om.c.priority, else_=normal
    )


def _rows(rows: PerRow | None) -> PerRow:
    if rows is None:
        raise ValueError("per-row due times need the rows they are for")
    return rows


def sweep_expired(*, now: datetime, actor: str, limit: int = 1000) -> Plan[list[Changed[Message]]]:
    """Expired leases become `unknown`, never a blind resend. Safe to run from every replica:
    rows another sweeper holds are skipped, and a swept row no longer matches."""
    return (
        yield from transition(
            Action.EXPIRE,
            as_row=message_from_row,
            where=om.c.lease_expires_at < now,
            values={
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
