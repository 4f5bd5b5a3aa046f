"""Tenants' own PURGE_AFTER_DAYS: how long each tenant's finished messages are kept when it
is not the setting's (services/maintenance.py purges by it)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select

from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.schema import tenant_retention as tr
from mailbag.store.types import insert_into


def put(*, tenant_id: str, purge_after_days: float, now: datetime) -> Plan[None]:
    """Keep this tenant's finished messages this many days (0: never purge them)."""
    values = {"purge_after_days": purge_after_days, "updated_at": now}
    dialect = yield from current_dialect()
    insert = insert_into(dialect, tr).values(tenant_id=tenant_id, **values)
    if dialect == "mysql":
        yield Step(insert.on_duplicate_key_update(values))
    else:
        yield Step(insert.on_conflict_do_update(index_elements=[tr.c.tenant_id], set_=values))


def remove(*, tenant_id: str) -> Plan[bool]:
    """Back to the setting; False if the tenant had no value of its own."""
    result = yield Step(delete(tr).where(tr.c.tenant_id == tenant_id))
    return bool(result.rowcount)  # type: ignore[attr-defined]


def all_days() -> Plan[dict[str, float]]:
    """Each tenant's own PURGE_AFTER_DAYS, by tenant id (the tenants without one: absent)."""
    rows = (yield Step(select(tr.c.tenant_id, tr.c.purge_after_days))).all()
    return {row.tenant_id: row.purge_after_days for row in rows}
