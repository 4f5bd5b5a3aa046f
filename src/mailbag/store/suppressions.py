"""The suppression list: (tenant, address) pairs that must not be sent to."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select

from mailbag.store.plan import Plan, Step, current_dialect
from mailbag.store.schema import suppressions
from mailbag.store.types import insert_unless_taken


@dataclass(frozen=True)
class Suppression:
    id: int
    tenant_id: str
    email: str
    reason: str
    detail: str | None
    created_at: datetime


def _suppression(row: Any) -> Suppression:
    return Suppression(row.id, row.tenant_id, row.email, row.reason, row.detail, row.created_at)


def add(
    *,
    tenant_id: str,
    email: str,
    reason: str,
    now: datetime,
    detail: str | None = None,
    source_event_id: int | None = None,
) -> Plan[bool]:
    """Suppress an address; False if it already was (the first reason is kept)."""
    email = email.lower()
    existing = (
        yield Step(
            select(suppressions.c.id).where(
                suppressions.c.tenant_id == tenant_id, suppressions.c.email == email
            )
        )
    ).first()
    if existing is not None:
        return False
    values = {
        "tenant_id": tenant_id,
        "email": email,
        "reason": reason,
        "detail": (detail or "")[:2000] or None,
        "source_event_id": source_event_id,
        "created_at": now,
    }
    dialect = yield from current_dialect()
    # Two bounces for one address can arrive at once; the second must not fail the first.
    yield Step(insert_unless_taken(dialect, suppressions).values(values))
    return True


def remove(*, tenant_id: str, email: str) -> Plan[bool]:
    result = yield Step(
        delete(suppressions).where(
            suppressions.c.tenant_id == tenant_id, suppressions.c.email == email.lower()
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def listing(
    *, tenant_id: str | None = None, limit: int = 100, offset: int = 0
) -> Plan[list[Suppression]]:
    query = select(suppressions).order_by(
        suppressions.c.created_at.desc(), suppressions.c.id.desc()
    )
    if tenant_id is not None:
        query = query.where(suppressions.c.tenant_id == tenant_id)
    rows = (yield Step(query.limit(limit).offset(offset))).all()
    return [_suppression(row) for row in rows]


def count() -> Plan[int]:
    return int((yield Step(select(func.count()).select_from(suppressions))).scalar_one())


def among(pairs: Iterable[tuple[str, str]]) -> Plan[frozenset[tuple[str, str]]]:
    """Which of these (tenant, address) pairs are suppressed (addresses compared in lower case)."""
    wanted = {(tenant, email.lower()) for tenant, email in pairs}
    if not wanted:
        return frozenset()
    tenants = {tenant for tenant, _ in wanted}
    emails = {email for _, email in wanted}
    rows = (
        yield Step(
            select(suppressions.c.tenant_id, suppressions.c.email).where(
                suppressions.c.tenant_id.in_(tenants), suppressions.c.email.in_(emails)
            )
        )
    ).all()
    return frozenset((row.tenant_id, row.email) for row in rows) & wanted
