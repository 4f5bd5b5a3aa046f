"""Sender identities: the From addresses each tenant may send from (`mailbag tenants senders
add`). A message's explicit `from` must be one of its tenant's; enqueue checks it before
writing anything. Addresses are compared in lower case, as suppressions are."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, select

from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.schema import tenant_senders as ts
from mailbag.store.types import insert_into


@dataclass(frozen=True)
class SenderIdentity:
    tenant_id: str
    address: str
    name: str | None
    created_at: datetime


def add(tenant_id: str, address: str, name: str | None, now: datetime) -> Plan[bool]:
    """Let a tenant send from an address; False if it already could (its name is kept)."""
    existing = (
        yield Step(
            select(ts.c.address).where(
                ts.c.tenant_id == tenant_id, func.lower(ts.c.address) == address.lower()
            )
        )
    ).first()
    if existing is not None:
        return False
    dialect = yield from current_dialect()
    insert = insert_into(dialect, ts)
    # Two operators adding the same address at once: the second is a no-op, not an error.
    if dialect == "mysql":
        insert = insert.on_duplicate_key_update(address=ts.c.address)
    else:
        insert = insert.on_conflict_do_nothing()
    values = {"tenant_id": tenant_id, "address": address, "name": name, "created_at": now}
    yield Step(insert.values(values))
    return True


def remove(tenant_id: str, address: str) -> Plan[bool]:
    """Take an address from a tenant's identities; False if it was not one."""
    result = yield Step(
        delete(ts).where(ts.c.tenant_id == tenant_id, func.lower(ts.c.address) == address.lower())
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def listing(tenant_id: str) -> Plan[list[SenderIdentity]]:
    """A tenant's sender identities, by address."""
    query = select(ts).where(ts.c.tenant_id == tenant_id).order_by(ts.c.address)
    rows = (yield Step(query)).all()
    return [SenderIdentity(r.tenant_id, r.address, r.name, r.created_at) for r in rows]


def owned(pairs: Iterable[tuple[str, str]]) -> Plan[dict[tuple[str, str], str | None]]:
    """Which of these (tenant, address) pairs are sender identities, with their names; keys
    hold the address in lower case."""
    wanted = {(tenant, address.lower()) for tenant, address in pairs}
    if not wanted:
        return {}
    query = select(ts.c.tenant_id, ts.c.address, ts.c.name).where(
        ts.c.tenant_id.in_({tenant for tenant, _ in wanted}),
        func.lower(ts.c.address).in_({address for _, address in wanted}),
    )
    found = {(r.tenant_id, r.address.lower()): r.name for r in (yield Step(query)).all()}
    return {pair: name for pair, name in found.items() if pair in wanted}
