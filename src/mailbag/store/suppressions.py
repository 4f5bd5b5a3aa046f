"""The suppression list: (tenant, address) pairs that must not be sent to.

An erased address (store/erasure.py) is suppressed by its keyed hash, never in clear. The
key is a subkey of SECRET_KEY (domain.erasure.ErasureKey) that the processes mailbag builds
carry on their engines as an execution option (ERASURE_KEY_OPTION, services.erasure
.connection_options), so every check here (`among`, and the first-use chain through
`forms`) and a removal by an operator find the hashed entry from the address. An
application's own connection is given it by services.outbox.write_many (the deployment's
Rules.erasure_key); a connection without it checks the plain addresses only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select

from mailbag.domain.erasure import ErasureKey
from mailbag.store.plan import Plan, Step, connection_option, current_dialect
from mailbag.store.schema import suppressions
from mailbag.store.types import insert_unless_taken, one_of

ERASURE_KEY_OPTION = "mailbag_erasure_key"  # the execution option that carries an ErasureKey


def erasure_key() -> Plan[ErasureKey | None]:
    """The ErasureKey of the connection this plan runs on, if it has one."""
    found = yield from connection_option(ERASURE_KEY_OPTION)
    return found if isinstance(found, ErasureKey) else None


def forms(address: str) -> Plan[tuple[str, str]]:
    """The two forms an address is suppressed under: lower case, and its keyed hash (the
    lower-case form again when the connection has no key)."""
    plain = address.lower()
    key = yield from erasure_key()
    return plain, key.hashed(plain) if key is not None else plain


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
    """Send to the address again: its plain entry, or its hashed one if it was erased."""
    plain, hashed = yield from forms(email)
    result = yield Step(
        delete(suppressions).where(
            suppressions.c.tenant_id == tenant_id, suppressions.c.email.in_({plain, hashed})
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
    key = yield from erasure_key()
    # Each form it may be suppressed under -> the lower-case address it stands for.
    plain_of = {email: email for _, email in wanted}
    if key is not None:
        plain_of.update({key.hashed(email): email for _, email in wanted})
    tenants = {tenant for tenant, _ in wanted}
    dialect = yield from current_dialect()
    rows = (
        yield Step(
            select(suppressions.c.tenant_id, suppressions.c.email).where(
                suppressions.c.tenant_id.in_(tenants),
                one_of(dialect, suppressions.c.email, plain_of, "emails"),
            )
        )
    ).all()
    return frozenset((row.tenant_id, plain_of.get(row.email, row.email)) for row in rows) & wanted
