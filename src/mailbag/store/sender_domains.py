"""Sender domains, their DKIM keys and their readiness. This module stores and reads the
sealed private keys only; services/sender_domains.py makes, seals and opens them, so no
plan here ever holds a private key in clear.

A domain is a tenant's (the `default` tenant's: the deployment's, for every tenant's mail
from it). Its keys are by selector, each `signing` (exactly one, except in a rotation's
first step), `next` (published beside it, not yet signing) or `retired` (still published
for the mail signed with it that is in flight, no longer signing). Every change of the
keys is announced (fleet_state.announce), so a listening worker signs with them at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update

from mailbag.domain.dkim import InvalidDomain, sender_domain
from mailbag.domain.message import DEFAULT_TENANT, InvalidMessage, NewMessage
from mailbag.store.fleet_state import announce
from mailbag.store.plan import Plan, Step
from mailbag.store.schema import dkim_keys as dk
from mailbag.store.schema import sender_domains as sd


class KeyState(StrEnum):
    SIGNING = "signing"
    NEXT = "next"
    RETIRED = "retired"


@dataclass(frozen=True)
class StoredKey:
    selector: str
    algorithm: str
    state: KeyState
    public_key: str
    created_at: datetime
    sealed_private_key: str = field(default="", repr=False)


@dataclass(frozen=True)
class StoredDomain:
    tenant_id: str
    domain: str
    created_at: datetime
    created_by: str
    ready: bool | None  # None: never checked
    checked_at: datetime | None
    ready_since: datetime | None
    report: list[dict[str, Any]] | None
    keys: tuple[StoredKey, ...] = ()  # the signing one first, then by selector

    @property
    def signing(self) -> StoredKey | None:
        return next((k for k in self.keys if k.state is KeyState.SIGNING), None)


@dataclass(frozen=True)
class NewKey:
    selector: str
    algorithm: str
    public_key: str
    sealed_private_key: str = field(repr=False)


def add(tenant_id: str, domain: str, key: NewKey, *, now: datetime, actor: str) -> Plan[bool]:
    """Add a domain with its first key, signing; False (nothing written) if the tenant has
    the domain already."""
    if (yield from _exists(tenant_id, domain)):
        return False
    yield Step(
        sd.insert().values(
            tenant_id=tenant_id, domain=domain, created_at=now, created_by=actor, ready=None
        )
    )
    yield from _insert_key(tenant_id, domain, key, KeyState.SIGNING, now)
    return True


def add_key(tenant_id: str, domain: str, key: NewKey, *, now: datetime) -> Plan[None]:
    """A rotation's first step: a `next` key beside the signing one."""
    yield from _insert_key(tenant_id, domain, key, KeyState.NEXT, now)


def promote(tenant_id: str, domain: str, selector: str) -> Plan[None]:
    """A rotation's last step: `selector` signs, the one that signed is retired."""
    of_domain = and_(dk.c.tenant_id == tenant_id, dk.c.domain == domain)
    yield Step(
        update(dk)
        .where(of_domain, dk.c.state == KeyState.SIGNING.value, dk.c.selector != selector)
        .values(state=KeyState.RETIRED.value)
    )
    yield Step(
        update(dk).where(of_domain, dk.c.selector == selector).values(state=KeyState.SIGNING.value)
    )
    yield from announce()


def remove(tenant_id: str, domain: str) -> Plan[bool]:
    """Remove a domain and its keys; False if the tenant has no such domain."""
    yield Step(delete(dk).where(dk.c.tenant_id == tenant_id, dk.c.domain == domain))
    result = yield Step(delete(sd).where(sd.c.tenant_id == tenant_id, sd.c.domain == domain))
    if not result.rowcount:  # type: ignore[attr-defined]
        return False
    yield from announce()
    return True


def remove_key(tenant_id: str, domain: str, selector: str) -> Plan[bool]:
    """Remove one key that does not sign; False if there is none by that selector."""
    result = yield Step(
        delete(dk).where(
            dk.c.tenant_id == tenant_id,
            dk.c.domain == domain,
            dk.c.selector == selector,
            dk.c.state != KeyState.SIGNING.value,
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def one(tenant_id: str, domain: str) -> Plan[StoredDomain | None]:
    """A tenant's domain with its keys (sealed), or None."""
    found = yield from _domains(and_(sd.c.tenant_id == tenant_id, sd.c.domain == domain))
    return found[0] if found else None


def listing(tenant_id: str | None = None) -> Plan[list[StoredDomain]]:
    """Every domain (of one tenant, or all), by tenant and domain, with their keys."""
    where = sd.c.tenant_id == tenant_id if tenant_id is not None else None
    return (yield from _domains(where))


def record_check(
    tenant_id: str, domain: str, *, ready: bool, report: list[dict[str, Any]], now: datetime
) -> Plan[bool]:
    """Keep what a check found; `ready_since` moves only when readiness changed. False if
    the domain is gone meanwhile."""
    row = (
        yield Step(select(sd.c.ready).where(sd.c.tenant_id == tenant_id, sd.c.domain == domain))
    ).first()
    if row is None:
        return False
    values: dict[str, Any] = {"ready": ready, "checked_at": now, "report": report}
    if row.ready is not ready:
        values["ready_since"] = now
    yield Step(update(sd).where(sd.c.tenant_id == tenant_id, sd.c.domain == domain).values(values))
    return True


def due(before: datetime, limit: int) -> Plan[list[tuple[str, str]]]:
    """Domains last checked before `before` (or never), oldest first."""
    rows = (
        yield Step(
            select(sd.c.tenant_id, sd.c.domain)
            .where(or_(sd.c.checked_at.is_(None), sd.c.checked_at < before))
            .order_by(sd.c.checked_at.is_not(None), sd.c.checked_at)
            .limit(limit)
        )
    ).all()
    return [(r.tenant_id, r.domain) for r in rows]


def readiness(pairs: Iterable[tuple[str, str]]) -> Plan[dict[tuple[str, str], bool]]:
    """Whether each (tenant, domain) that exists was ready at its last check (a domain
    never checked is not)."""
    wanted = set(pairs)
    if not wanted:
        return {}
    tenants, domains = sorted({t for t, _ in wanted}), sorted({d for _, d in wanted})
    rows = (
        yield Step(
            select(sd.c.tenant_id, sd.c.domain, sd.c.ready).where(
                sd.c.tenant_id.in_(tenants), sd.c.domain.in_(domains)
            )
        )
    ).all()
    found = {(r.tenant_id, r.domain): bool(r.ready) for r in rows}
    return {pair: ready for pair, ready in found.items() if pair in wanted}


def require_ready(messages: Sequence[NewMessage], default_from: str) -> Plan[None]:
    """REQUIRE_READY_DOMAINS: InvalidMessage, before anything is written, for the first
    message `unready` finds."""
    refused = yield from unready(messages, default_from)
    if refused:
        raise refused[min(refused)]


def unready(messages: Sequence[NewMessage], default_from: str) -> Plan[dict[int, InvalidMessage]]:
    """The messages (by position) whose From (its own, else `default_from`) is on a domain
    that is not ready, neither their tenant's nor the deployment's (the default tenant's),
    each with its error. One query for all of them."""
    wanted: list[tuple[str, str]] = []
    for m in messages:
        address = m.from_address or default_from
        try:
            wanted.append((m.tenant_id, sender_domain(address.rpartition("@")[2])))
        except InvalidDomain:
            wanted.append((m.tenant_id, ""))
    pairs = {(t, d) for tenant, d in wanted for t in (tenant, DEFAULT_TENANT) if d}
    found = yield from readiness(pairs)
    refused: dict[int, InvalidMessage] = {}
    for index, (tenant, domain) in enumerate(wanted):
        if found.get((tenant, domain)) or found.get((DEFAULT_TENANT, domain)):
            continue
        known = (tenant, domain) in found or (DEFAULT_TENANT, domain) in found
        why = (
            f"run `mailbag domains check {tenant} {domain}` and publish what it says"
            if known
            else f"add it with `mailbag domains add {tenant} {domain}`"
        )
        refused[index] = InvalidMessage(
            {"from": f"the sender domain {domain or '(none)'} is not ready to send: {why}"}
        )
    return refused


def not_ready_count() -> Plan[int]:
    """Domains whose last check found them not ready (the metric's)."""
    count = select(func.count()).select_from(sd).where(sd.c.ready.is_(False))
    return int((yield Step(count)).scalar_one())


def signing_keys() -> Plan[dict[tuple[str, str], StoredKey]]:
    """Every domain's signing key (sealed), by (tenant, domain): what a worker signs with."""
    rows = (yield Step(select(dk).where(dk.c.state == KeyState.SIGNING.value))).all()
    return {(r.tenant_id, r.domain): _key(r) for r in rows}


def _exists(tenant_id: str, domain: str) -> Plan[bool]:
    row = (
        yield Step(select(sd.c.domain).where(sd.c.tenant_id == tenant_id, sd.c.domain == domain))
    ).first()
    return row is not None


def _insert_key(
    tenant_id: str, domain: str, key: NewKey, state: KeyState, now: datetime
) -> Plan[None]:
    yield Step(
        dk.insert().values(
            tenant_id=tenant_id,
            domain=domain,
            selector=key.selector,
            algorithm=key.algorithm,
            state=state.value,
            public_key=key.public_key,
            sealed_private_key=key.sealed_private_key,
            created_at=now,
        )
    )
    yield from announce()


def _domains(where: Any) -> Plan[list[StoredDomain]]:
    domains = select(sd).order_by(sd.c.tenant_id, sd.c.domain)
    keys = select(dk).join(sd, and_(dk.c.tenant_id == sd.c.tenant_id, dk.c.domain == sd.c.domain))
    if where is not None:
        domains, keys = domains.where(where), keys.where(where)
    rows = (yield Step(domains)).all()
    by_domain: dict[tuple[str, str], list[StoredKey]] = {}
    for r in (yield Step(keys.order_by(dk.c.selector))).all():
        by_domain.setdefault((r.tenant_id, r.domain), []).append(_key(r))
    return [_domain(r, by_domain.get((r.tenant_id, r.domain), [])) for r in rows]


def _key(row: Any) -> StoredKey:
    return StoredKey(
        row.selector,
        row.algorithm,
        KeyState(row.state),
        row.public_key,
        row.created_at,
        row.sealed_private_key,
    )


def _domain(row: Any, keys: list[StoredKey]) -> StoredDomain:
    order = {KeyState.SIGNING: 0, KeyState.NEXT: 1, KeyState.RETIRED: 2}
    return StoredDomain(
        row.tenant_id,
        row.domain,
        row.created_at,
        row.created_by,
        row.ready,
        row.checked_at,
        row.ready_since,
        row.report,
        tuple(sorted(keys, key=lambda k: (order[k.state], k.selector))),
    )


def live_records(domain: StoredDomain) -> Mapping[str, tuple[str, str]]:
    """Each published key's selector: (algorithm, public key), the signing one first."""
    return {k.selector: (k.algorithm, k.public_key) for k in domain.keys}
