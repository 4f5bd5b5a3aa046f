"""Tenants' own provider accounts: at most one a tenant, its kind (a provider's name) and
that kind's settings, sealed as a whole. This module stores and reads the sealed text only;
services/tenant_accounts.py seals and opens it, so no plan here ever holds a credential.

A tenant's account goes with its tenant (ON DELETE CASCADE).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select

from mailbag.store.fleet_state import announce
from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.schema import tenant_accounts as ta
from mailbag.store.types import insert_into


@dataclass(frozen=True)
class StoredAccount:
    """An account as a listing shows it: no settings, sealed or not."""

    tenant_id: str
    kind: str
    created_at: datetime
    updated_at: datetime
    updated_by: str


@dataclass(frozen=True)
class SealedAccount:
    """An account with its settings still sealed."""

    tenant_id: str
    kind: str
    sealed_settings: str
    created_at: datetime
    updated_at: datetime
    updated_by: str


def put(tenant_id: str, kind: str, sealed: str, *, now: datetime, actor: str) -> Plan[bool]:
    """Give a tenant its own account, or replace the one it has (its creation time stays);
    True when it had none. One upsert: two operators at once leave the later one's."""
    existed = (yield Step(select(ta.c.tenant_id).where(ta.c.tenant_id == tenant_id))).first()
    dialect = yield from current_dialect()
    changed = {"kind": kind, "sealed_settings": sealed, "updated_at": now, "updated_by": actor}
    insert = insert_into(dialect, ta).values(tenant_id=tenant_id, created_at=now, **changed)
    if dialect == "mysql":
        insert = insert.on_duplicate_key_update(**changed)
    else:
        insert = insert.on_conflict_do_update(index_elements=[ta.c.tenant_id], set_=changed)
    yield Step(insert)
    yield from announce()  # the workers build it anew
    return existed is None


def remove(tenant_id: str) -> Plan[bool]:
    """Take a tenant's own account away; False if it had none."""
    result = yield Step(delete(ta).where(ta.c.tenant_id == tenant_id))
    if not result.rowcount:  # type: ignore[attr-defined]
        return False
    yield from announce()
    return True


def sealed_one(tenant_id: str) -> Plan[SealedAccount | None]:
    """A tenant's own account, its settings sealed; None if it has none."""
    row = (yield Step(select(ta).where(ta.c.tenant_id == tenant_id))).first()
    return _sealed(row) if row is not None else None


def listing() -> Plan[list[StoredAccount]]:
    """Every tenant's own account, by tenant id, without its settings."""
    columns = (ta.c.tenant_id, ta.c.kind, ta.c.created_at, ta.c.updated_at, ta.c.updated_by)
    rows = (yield Step(select(*columns).order_by(ta.c.tenant_id))).all()
    return [
        StoredAccount(r.tenant_id, r.kind, r.created_at, r.updated_at, r.updated_by) for r in rows
    ]


def sealed_all() -> Plan[list[SealedAccount]]:
    """Every tenant's own account with its settings sealed, by tenant id (what a worker
    reads to build each tenant's provider)."""
    rows = (yield Step(select(ta).order_by(ta.c.tenant_id))).all()
    return [_sealed(row) for row in rows]


def _sealed(row: Any) -> SealedAccount:
    return SealedAccount(
        row.tenant_id, row.kind, row.sealed_settings, row.created_at, row.updated_at, row.updated_by
    )
