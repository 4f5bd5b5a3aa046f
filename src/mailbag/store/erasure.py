"""Erasure of one person's data, in chunks (services/erasure.py runs them; domain/erasure.py
has the rules).

A row belongs to the erasure when one of its text columns quotes the address, in any case
(`_mentions`: lower(column) LIKE '%address%', JSON read as its text). That predicate is also
what makes the erasure resumable: an erased row no longer quotes the address, so every
chunk takes the first CHUNK rows that still do, and a run interrupted anywhere continues
with what is left when it runs again. `erasures.progress` counts what each table lost,
written in the transaction of each chunk, so the counts survive the interruption too.

Order of one erasure (services.erasure.Erasures.run):
1. `begin`: the erasure's record, and the address suppressed by its keyed hash for every
   tenant in scope (a plain suppression of it becomes the hash), so that no enqueue adds
   mail for it while the chunks run;
2. `erase_messages` until it comes back short: the messages that quote it, with what hangs
   from them (history details, hook deliveries, provider events, attachments nothing else
   carries); a message a worker holds right now is left for a later run;
3. `erase_rows` for each table of OTHER_ROWS until short: rows not tied to an erased
   message that quote the address (verifications, idempotency answers, unmatched events);
4. `finish`: done, or waiting when messages in flight remain.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    Table,
    Text,
    and_,
    bindparam,
    cast,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    true,
    update,
)

from mailbag.domain.erasure import ERASED_BODY, ERASED_TEXT, PLACEHOLDER, State
from mailbag.domain.ids import uuid7
from mailbag.domain.message import DEFAULT_TENANT
from mailbag.domain.states import Action, Status
from mailbag.store.message_transitions import message_from_row, om, transition
from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.schema import (
    attachments,
    email_verifications,
    erasures,
    hook_deliveries,
    hook_delivery_events,
    idempotency_records,
    message_attachments,
    message_events,
    pauses,
    provider_events,
    provider_health,
    suppressions,
    tenants,
    verification_events,
    verification_sends,
)
from mailbag.store.transition import EventSpec
from mailbag.store.types import insert_unless_taken


@dataclass(frozen=True)
class Erasure:
    id: uuid.UUID
    tenant_id: str | None  # None: every tenant
    address_hash: str
    state: str
    progress: Mapping[str, int]  # rows erased, by table
    requested_at: datetime
    requested_by: str
    updated_at: datetime
    finished_at: datetime | None


def _erasure(row: Any) -> Erasure:
    return Erasure(
        row.id,
        row.tenant_id,
        row.address_hash,
        row.state,
        dict(row.progress or {}),
        row.requested_at,
        row.requested_by,
        row.updated_at,
        row.finished_at,
    )


def _mentions(address: str, *columns: ColumnElement[Any]) -> ColumnElement[bool]:
    """Whether any of these columns quotes the address, whatever its case (JSON as text).
    `autoescape`: an address's `_` or `%` is itself, not a LIKE wildcard."""
    wanted = address.lower()
    return or_(
        *(
            func.lower(cast(c, Text) if isinstance(c.type, JSON) else c).contains(
                wanted, autoescape=True
            )
            for c in columns
        )
    )


# --- the record and the suppression ----------------------------------------------------


def begin(
    *, address: str, address_hash: str, tenant_id: str | None, now: datetime, actor: str
) -> Plan[Erasure]:
    """The unfinished erasure of this address in this scope, or a new one; and the address
    suppressed, by its hash, for every tenant in scope (a plain suppression of it too)."""
    scope = (
        erasures.c.tenant_id.is_(None) if tenant_id is None else erasures.c.tenant_id == tenant_id
    )
    found = (
        yield Step(
            select(erasures)
            .where(erasures.c.address_hash == address_hash, scope, erasures.c.state != State.DONE)
            .order_by(erasures.c.requested_at)
            .limit(1)
        )
    ).first()
    if found is None:
        row: dict[str, Any] = {
            "id": uuid7(),
            "tenant_id": tenant_id,
            "address_hash": address_hash,
            "state": State.RUNNING.value,
            "progress": {},
            "requested_at": now,
            "requested_by": actor,
            "updated_at": now,
            "finished_at": None,
        }
        yield Step(insert(erasures).values(row))
        found = (yield Step(select(erasures).where(erasures.c.id == row["id"]))).one()
    yield from _suppress(address=address, address_hash=address_hash, tenant_id=tenant_id, now=now)
    return _erasure(found)


def _suppress(
    *, address: str, address_hash: str, tenant_id: str | None, now: datetime
) -> Plan[None]:
    in_scope = true() if tenant_id is None else suppressions.c.tenant_id == tenant_id
    plain = and_(in_scope, func.lower(suppressions.c.email) == address.lower())
    held = set((yield Step(select(suppressions.c.tenant_id).where(plain))).scalars().all())
    if tenant_id is not None:
        owners = {tenant_id}
    else:  # every tenant there is, and the CLI's and the Python API's
        owners = {DEFAULT_TENANT, *(yield Step(select(tenants.c.id))).scalars().all()}
    hashed = set(
        (
            yield Step(
                select(suppressions.c.tenant_id).where(
                    suppressions.c.email == address_hash, suppressions.c.tenant_id.in_(owners)
                )
            )
        )
        .scalars()
        .all()
    )
    # A plain suppression becomes the hash, keeping its reason (and its age); where the
    # hash is there already, the plain one goes.
    yield Step(delete(suppressions).where(plain, suppressions.c.tenant_id.in_(hashed)))
    yield Step(update(suppressions).where(plain).values(email=address_hash, detail=None))
    missing = sorted(owners - hashed - held)
    if missing:
        dialect = yield from current_dialect()
        rows = [
            {
                "tenant_id": owner,
                "email": address_hash,
                "reason": "erased",
                "detail": None,
                "source_event_id": None,
                "created_at": now,
            }
            for owner in missing
        ]
        yield Step(insert_unless_taken(dialect, suppressions), rows)


def get(erasure_id: uuid.UUID) -> Plan[Erasure | None]:
    """One erasure by its id (None if there is none)."""
    row = (yield Step(select(erasures).where(erasures.c.id == erasure_id))).first()
    return _erasure(row) if row is not None else None


def listing(*, limit: int = 100) -> Plan[list[Erasure]]:
    """Erasures, newest first."""
    query = select(erasures).order_by(erasures.c.requested_at.desc(), erasures.c.id.desc())
    return [_erasure(row) for row in (yield Step(query.limit(limit))).all()]


def _progress(erasure_id: uuid.UUID, counted: Mapping[str, int], now: datetime) -> Plan[None]:
    """Add what a chunk erased to the record's counts, in the chunk's transaction (the row
    is read under its lock, so two runs of one erasure never lose each other's counts)."""
    current = (
        yield Step(select(erasures.c.progress).where(erasures.c.id == erasure_id).with_for_update())
    ).scalar_one()
    progress = dict(current or {})
    for table, n in counted.items():
        if n:
            progress[table] = progress.get(table, 0) + n
    yield Step(
        update(erasures)
        .where(erasures.c.id == erasure_id)
        .values(progress=progress, updated_at=now, state=State.RUNNING.value)
    )


def finish(erasure_id: uuid.UUID, *, waiting: bool, now: datetime) -> Plan[Erasure]:
    """An erasure ends its run: done, or waiting for the messages a worker holds."""
    values: dict[str, Any] = {"updated_at": now}
    if waiting:
        values["state"] = State.WAITING.value
    else:
        values.update(state=State.DONE.value, finished_at=now)
    yield Step(update(erasures).where(erasures.c.id == erasure_id).values(values))
    return _erasure((yield Step(select(erasures).where(erasures.c.id == erasure_id))).one())


# --- messages -------------------------------------------------------------------------

# What an erased message keeps of its text: nothing personal. Its tenant, template name,
# states, attempts, times and provider message id stay, so counts and history add up.
MESSAGE_SCRUB: dict[str, Any] = {
    "idempotency_key": None,  # an application's key may hold the address ("welcome-ada@...")
    "to_address": PLACEHOLDER,
    "to_name": None,
    "from_address": None,
    "subject": None,
    "template_data": {},
    "headers": {},
    "tags": [],
    "metadata": {},
    "last_error": None,
    "carried": None,  # cc/bcc/reply-to, ready-made bodies, suppressed recipients
    "attachment_count": 0,
}
MESSAGE_TEXT = tuple(om.c[name] for name in MESSAGE_SCRUB if name != "attachment_count")
IN_FLIGHT = om.c.status == Status.PROCESSING.value


def _of_tenant(table: Table, tenant_id: str | None) -> ColumnElement[bool]:
    return true() if tenant_id is None else table.c.tenant_id == tenant_id


def held_messages(*, address: str, tenant_id: str | None) -> Plan[int]:
    """How many messages that quote the address a worker holds right now (left for later)."""
    mentioning = and_(_of_tenant(om, tenant_id), _mentions(address, *MESSAGE_TEXT), IN_FLIGHT)
    return int((yield Step(select(func.count()).where(mentioning))).scalar_one())


def erase_messages(
    erasure_id: uuid.UUID,
    *,
    address: str,
    tenant_id: str | None,
    now: datetime,
    actor: str,
    limit: int,
) -> Plan[int]:
    """Erase up to `limit` messages that quote the address and no worker holds; how many.

    A pending or retrying one is withdrawn first (ERASE: cancelled, with its history row),
    so no worker sends it to the placeholder. Each erased message gets a history row that
    says it was erased (by which erasure, not whose address)."""
    mentioning = and_(_of_tenant(om, tenant_id), _mentions(address, *MESSAGE_TEXT), ~IN_FLIGHT)
    chunk = select(om.c.id).where(mentioning).order_by(om.c.id).limit(limit)
    ids = list((yield Step(chunk)).scalars().all())
    if not ids:
        return 0
    yield from transition(
        Action.ERASE,
        as_row=message_from_row,
        where=om.c.id.in_(ids),
        now=now,
        actor=actor,
        event=EventSpec(text="withdrawn: its recipient's data was erased"),
    )
    # The guard again: a message claimed since the chunk was read is left for a later run.
    settled = and_(om.c.id.in_(ids), ~IN_FLIGHT)
    erased = list((yield Step(select(om.c.id).where(settled))).scalars().all())
    if not erased:
        return 0
    yield Step(
        update(message_events).where(message_events.c.message_id.in_(erased)).values(detail=None)
    )
    yield Step(
        insert(message_events).from_select(
            ["message_id", "from_status", "to_status", "at", "actor", "attempt", "detail"],
            select(
                om.c.id,
                om.c.status,
                om.c.status,
                literal(now, message_events.c.at.type),
                literal(actor, message_events.c.actor.type),
                om.c.attempt_count,
                literal(f"erased ({erasure_id})", message_events.c.detail.type),
            ).where(om.c.id.in_(erased)),
        )
    )
    of_erased = hook_deliveries.c.message_id.in_(erased)
    yield Step(
        update(hook_delivery_events)
        .where(
            hook_delivery_events.c.delivery_id.in_(select(hook_deliveries.c.id).where(of_erased))
        )
        .values(detail=None)
    )
    yield Step(
        update(hook_deliveries).where(of_erased).values(payload=ERASED_BODY, last_error=None)
    )
    yield Step(
        update(provider_events)
        .where(provider_events.c.message_id.in_(erased))
        .values(recipient=None, detail=None, raw={})
    )
    yield from _drop_attachments(erased)
    yield Step(update(om).where(settled).values(MESSAGE_SCRUB))
    yield from _progress(erasure_id, {"outbox_messages": len(erased)}, now)
    return len(erased)


def _drop_attachments(message_ids: list[uuid.UUID]) -> Plan[None]:
    """The messages' attachments go; their bytes too, unless another message carries them."""
    mine = message_attachments.c.message_id.in_(message_ids)
    shas = list((yield Step(select(message_attachments.c.sha256).where(mine))).scalars().all())
    if not shas:
        return
    yield Step(delete(message_attachments).where(mine))
    carried_elsewhere = exists().where(message_attachments.c.sha256 == attachments.c.sha256)
    yield Step(delete(attachments).where(attachments.c.sha256.in_(set(shas)), ~carried_elsewhere))


# --- every other row that may quote the address --------------------------------------


@dataclass(frozen=True)
class Rows:
    """A table whose rows may quote the address outside an erased message: the columns
    searched, what a matching row gets instead (`scrub(row)`, per row: some values must
    stay unique), and which rows a tenant's erasure reaches."""

    table: Table
    searched: tuple[str, ...]
    scrub: Callable[[Any], dict[str, Any]]
    of_tenant: Callable[[str], ColumnElement[bool]]

    @property
    def key(self) -> str:
        return next(iter(self.table.primary_key.columns)).name


def _with(values: dict[str, Any]) -> Callable[[Any], dict[str, Any]]:
    return lambda _row: values


def _through(table: Table, column: str, parent: Table) -> Callable[[str], ColumnElement[bool]]:
    """Rows of a table without a tenant column: those of its parent rows' tenant."""
    return lambda tenant: table.c[column].in_(
        select(parent.c.id).where(parent.c.tenant_id == tenant)
    )


def _own(table: Table) -> Callable[[str], ColumnElement[bool]]:
    return lambda tenant: table.c.tenant_id == tenant


def _fleet(_tenant: str) -> ColumnElement[bool]:
    # The fleet's rows (a breaker's last error, a pause's reason) belong to no tenant: an
    # error that quotes the address is about that person, whoever's mail it was.
    return true()


OTHER_ROWS: tuple[Rows, ...] = (
    Rows(
        message_events,
        ("detail", "actor"),
        _with({"detail": None, "actor": ERASED_TEXT}),
        _through(message_events, "message_id", om),
    ),
    Rows(
        hook_deliveries,
        ("payload", "last_error"),
        _with({"payload": ERASED_BODY, "last_error": None}),
        _own(hook_deliveries),
    ),
    Rows(
        hook_delivery_events,
        ("detail",),
        _with({"detail": None}),
        _through(hook_delivery_events, "delivery_id", hook_deliveries),
    ),
    Rows(
        provider_events,
        ("recipient", "detail", "raw"),
        _with({"recipient": None, "detail": None, "raw": {}}),
        # An event matched to no message has no tenant: a tenant's erasure takes it too.
        lambda tenant: or_(
            provider_events.c.tenant_id == tenant, provider_events.c.tenant_id.is_(None)
        ),
    ),
    Rows(
        idempotency_records,
        ("idempotency_key", "response_body"),
        # The key stays unique per tenant: it becomes one nobody sends.
        lambda row: {"idempotency_key": f"erased:{row.id}", "response_body": {"erased": True}},
        _own(idempotency_records),
    ),
    Rows(
        email_verifications,
        ("email", "redirect_url"),
        # One active verification per (tenant, address): each erased one gets its own.
        lambda row: {"email": f"erased.{row.id.hex}@erased.invalid", "redirect_url": None},
        _own(email_verifications),
    ),
    Rows(
        verification_events,
        ("detail", "actor"),
        _with({"detail": None, "actor": ERASED_TEXT}),
        _through(verification_events, "verification_id", email_verifications),
    ),
    Rows(verification_sends, ("email",), _with({"email": PLACEHOLDER}), _own(verification_sends)),
    Rows(suppressions, ("detail",), _with({"detail": None}), _own(suppressions)),
    Rows(provider_health, ("last_error",), _with({"last_error": None}), _fleet),
    Rows(
        pauses, ("reason", "paused_by"), _with({"reason": None, "paused_by": ERASED_TEXT}), _fleet
    ),
)


def erase_rows(
    erasure_id: uuid.UUID,
    rows: Rows,
    *,
    address: str,
    tenant_id: str | None,
    now: datetime,
    limit: int,
) -> Plan[int]:
    """Scrub up to `limit` rows of one table that quote the address; how many."""
    table = rows.table
    key = table.c[rows.key]
    scope = true() if tenant_id is None else rows.of_tenant(tenant_id)
    mentioning = and_(scope, _mentions(address, *(table.c[name] for name in rows.searched)))
    found = (yield Step(select(table).where(mentioning).order_by(key).limit(limit))).all()
    if not found:
        return 0
    # One UPDATE by key, its values per row (executemany).
    names = list(rows.scrub(found[0]))
    statement = (
        update(table)
        .where(key == bindparam("erased_key"))
        .values({n: bindparam(f"erased_{n}", type_=table.c[n].type) for n in names})
    )
    params = [
        {
            "erased_key": row._mapping[rows.key],
            **{f"erased_{k}": v for k, v in rows.scrub(row).items()},
        }
        for row in found
    ]
    yield Step(statement, params)
    yield from _progress(erasure_id, {table.name: len(found)}, now)
    return len(found)
