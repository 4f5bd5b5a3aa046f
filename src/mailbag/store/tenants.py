"""Tenants and their API keys (only a digest of each key is stored)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, or_, select

from mailbag.store.plan import Plan, Step
from mailbag.store.schema import tenants


@dataclass(frozen=True)
class Tenant:
    id: str
    name: str
    api_key_prefix: str
    created_at: datetime


def _tenant(row: Any) -> Tenant:
    return Tenant(row.id, row.name, row.api_key_prefix, row.created_at)


def create(
    *, tenant_id: str, name: str, key_digest: str, key_prefix: str, now: datetime
) -> Plan[Tenant]:
    values = {
        "id": tenant_id,
        "name": name,
        "api_key_digest": key_digest,
        "api_key_prefix": key_prefix,
        "created_at": now,
    }
    yield Step(insert(tenants).values(values))
    return Tenant(tenant_id, name, key_prefix, now)


def by_key_digest(key_digest: str) -> Plan[Tenant | None]:
    row = (yield Step(select(tenants).where(tenants.c.api_key_digest == key_digest))).first()
    return _tenant(row) if row else None


def by_name(name: str) -> Plan[Tenant | None]:
    row = (yield Step(select(tenants).where(tenants.c.name == name))).first()
    return _tenant(row) if row else None


def named(tenant: str) -> Plan[list[Tenant]]:
    """The tenants whose id or name is `tenant` (two unique indexes: at most two rows)."""
    rows = (
        yield Step(select(tenants).where(or_(tenants.c.id == tenant, tenants.c.name == tenant)))
    ).all()
    return [_tenant(row) for row in rows]


def all_tenants() -> Plan[list[Tenant]]:
    rows = (yield Step(select(tenants).order_by(tenants.c.created_at))).all()
    return [_tenant(row) for row in rows]
