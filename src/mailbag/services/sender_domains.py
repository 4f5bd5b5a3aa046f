"""Sender domains: the domains a tenant sends from, each with its DKIM key, the DNS records
to publish, and whether the published ones make it ready (`mailbag domains`, the admin
API, the console, and the scheduler's re-check).

A domain's private key is made here (or read from a key file), sealed with the hooks'
SecretBox under a key derived from the deployment's secret key (`DOMAIN_KEY_PURPOSE`), and
opened only by workers, to sign (`opened_keys`). It is never shown again: the DNS record
shows the public half.

Readiness: `check` asks DNS for every record (resolver.TxtResolver: DNS_NAMESERVERS, else
the system's) and keeps what it found; the domain is ready when the signing key's DKIM
record, SPF and DMARC are all ok (a rotation's other keys are reported, never counted).
With REQUIRE_READY_DOMAINS, enqueue refuses a From on a domain that is not
(store/sender_domains.require_ready).

Errors:
    NoDomainKey      no deployment key to seal or open with: 409, exit 1
    InvalidDomain    a domain, selector, algorithm or key file the rules refuse: 422, exit 2
    DomainExists     the tenant has the domain, or the selector, already: 409, exit 1
    UnknownDomain    the tenant has no such domain, or key: 404, exit 1
    RotationRefused  a rotation step that cannot be taken now (the message says why): 409,
                     exit 1
    UnknownTenant    (services.tenants) no tenant has that id or name: 404, exit 2
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from mailbag import keys, log
from mailbag.domain import dkim
from mailbag.domain import sender_domains as rules
from mailbag.domain.dkim import Algorithm, InvalidDomain, SigningKey
from mailbag.domain.hooks import SecretBox, WrongHooksKey
from mailbag.domain.sender_domains import Finding, Purpose, Record
from mailbag.resolver import LookupFailed, TxtResolver, nameservers
from mailbag.services.tenants import tenant_id_of
from mailbag.store import sender_domains as store
from mailbag.store.plan import Plan
from mailbag.store.sender_domains import KeyState, NewKey, StoredDomain
from mailbag.store.session import AsyncDatabase, AsyncSession

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy.ext.asyncio import AsyncEngine

    from mailbag.settings import Settings

__all__ = ["InvalidDomain"]  # raised here too, from the domain rules

DOMAIN_KEY_PURPOSE = "sender-domains"  # the subkey's purpose (keys.derive)
CHECK_BATCH = 50  # domains the scheduler re-checks in one run at most


class NoDomainKey(Exception):
    """No deployment key to seal or open DKIM keys with; the message says what to set."""


class DomainExists(Exception):
    pass


class UnknownDomain(LookupError):
    pass


class RotationRefused(Exception):
    pass


@dataclass(frozen=True)
class KeyView:
    selector: str
    algorithm: str
    state: str


@dataclass(frozen=True)
class DomainView:
    """A domain as people see it: its keys (no private half), the records to publish, and
    what the last check found."""

    tenant_id: str
    domain: str
    keys: tuple[KeyView, ...]
    records: tuple[Record, ...]
    ready: bool | None  # None: never checked
    checked_at: datetime | None
    ready_since: datetime | None
    findings: tuple[dict[str, Any], ...]
    created_at: datetime

    @property
    def state(self) -> str:
        return "unchecked" if self.ready is None else "ready" if self.ready else "not ready"

    def as_dict(self) -> dict[str, Any]:
        def when(at: datetime | None) -> str | None:
            return at.isoformat() if at is not None else None

        return {
            "tenant_id": self.tenant_id,
            "domain": self.domain,
            "state": self.state,
            "ready": self.ready,
            "checked_at": when(self.checked_at),
            "ready_since": when(self.ready_since),
            "keys": [k.__dict__ for k in self.keys],
            "records": [r.as_dict() for r in self.records],
            "findings": list(self.findings),
            "created_at": self.created_at.isoformat(),
        }


def domain_box(settings: Settings) -> SecretBox:
    """What seals and opens DKIM private keys: a subkey of the deployment key. NoDomainKey
    if there is none: a private key is never stored in clear."""
    try:
        key = settings.key
    except keys.MissingSecretKey as exc:
        raise NoDomainKey(f"DKIM keys are sealed with the secret key: {exc}") from None
    return SecretBox(keys.derive(key, DOMAIN_KEY_PURPOSE).hex())


def spf_mechanisms(settings: Settings) -> tuple[str, ...]:
    """The SPF mechanisms the configured providers declare (`Capabilities.spf`)."""
    from mailbag import providers

    kinds = [settings.provider_table(n)[0] for n in settings.providers] or [settings.provider]
    found = (providers.capabilities(kind).spf for kind in kinds)
    return tuple(sorted({mechanism for mechanism in found if mechanism}))


def algorithm_of(text: str) -> Algorithm:
    try:
        return Algorithm(text.strip().lower())
    except ValueError:
        raise InvalidDomain(f"algorithm: {text[:20]!r} is not rsa or ed25519") from None


def default_selector(now: datetime, taken: Iterable[str] = ()) -> str:
    """`mbYYYYMMDD`, or with -2, -3, ... when a key of that day exists."""
    base, used = f"mb{now:%Y%m%d}", set(taken)
    return next(s for s in (base, *(f"{base}-{n}" for n in range(2, 100))) if s not in used)


def view(domain: StoredDomain, spf: Sequence[str]) -> DomainView:
    return DomainView(
        domain.tenant_id,
        domain.domain,
        tuple(KeyView(k.selector, k.algorithm, k.state.value) for k in domain.keys),
        tuple(_records(domain, spf)),
        domain.ready,
        domain.checked_at,
        domain.ready_since,
        tuple(domain.report or ()),
        domain.created_at,
    )


def _records(domain: StoredDomain, spf: Sequence[str]) -> list[Record]:
    published = {
        k.selector: dkim.dkim_record(Algorithm(k.algorithm), k.public_key) for k in domain.keys
    }
    return rules.records(domain.domain, published, spf)


def counted(finding: Finding, domain: StoredDomain) -> bool:
    """Whether a finding decides readiness: SPF, DMARC and the signing key's record."""
    if finding.record.purpose is not Purpose.DKIM:
        return True
    signing = domain.signing
    return signing is not None and finding.record.selector == signing.selector


async def judge_all(
    domain: StoredDomain, spf: Sequence[str], resolver: TxtResolver
) -> tuple[bool, list[Finding]]:
    """Ask DNS for every record of `domain`, all at once: (ready, the findings)."""
    records = _records(domain, spf)

    async def answer(record: Record) -> rules.Answer:
        try:
            return await resolver.txt(record.name)
        except LookupFailed as exc:
            return rules.Unanswered(str(exc))

    answers = await asyncio.gather(*(answer(record) for record in records))
    findings = [rules.judge(r, a, spf) for r, a in zip(records, answers, strict=True)]
    return rules.ready(f for f in findings if counted(f, domain)), findings


def opened_keys(box: SecretBox) -> Plan[dict[tuple[str, str], SigningKey]]:
    """Every domain's signing key, opened, by (tenant, domain): what a worker signs with.
    A key that does not open (sealed under another secret key) is logged and left out:
    that domain's mail goes unsigned, no other domain's is touched."""
    found: dict[tuple[str, str], SigningKey] = {}
    for (tenant_id, domain), key in (yield from store.signing_keys()).items():
        try:
            private = box.open(key.sealed_private_key).encode("ascii")
        except (WrongHooksKey, ValueError):
            log.get("mailbag.domains").warning(
                "dkim_key_unreadable", tenant=tenant_id, domain=domain, selector=key.selector
            )
            continue
        found[(tenant_id, domain)] = SigningKey(
            domain, key.selector, Algorithm(key.algorithm), private
        )
    return found


class SenderDomains:
    """Sender domains for every door; a tenant is named by its id or its name."""

    def __init__(
        self, engine: AsyncEngine, settings: Settings, resolver: TxtResolver | None = None
    ) -> None:
        self.db, self.settings = AsyncDatabase(engine), settings
        self.spf = spf_mechanisms(settings)
        self._resolver = resolver

    @property
    def resolver(self) -> TxtResolver:
        if self._resolver is None:
            self._resolver = TxtResolver(
                nameservers(self.settings.dns_nameservers),
                timeout=self.settings.dns_timeout_seconds,
            )
        return self._resolver

    def _new_key(self, pair: dkim.KeyPair, selector: str) -> NewKey:
        sealed = domain_box(self.settings).seal(pair.private.decode("ascii"))
        return NewKey(selector, pair.algorithm.value, pair.public, sealed)

    async def add(
        self,
        tenant: str,
        domain: str,
        *,
        now: datetime,
        actor: str,
        selector: str | None = None,
        algorithm: str = "rsa",
        key_file: bytes | None = None,
    ) -> DomainView:
        """Add a domain with a new key (or the key file's), signing from now; the view
        holds the records to publish."""
        name = dkim.sender_domain(domain)
        chosen = dkim.selector(selector) if selector is not None else default_selector(now)
        pair = dkim.imported(key_file) if key_file is not None else None
        if pair is None:
            pair = dkim.generate(algorithm_of(algorithm))
        key = self._new_key(pair, chosen)  # sealed before the database: NoDomainKey first
        async with self.db.transaction() as tx:
            tenant_id = await tx.run(tenant_id_of(tenant))
            if not await tx.run(store.add(tenant_id, name, key, now=now, actor=actor)):
                raise DomainExists(f"tenant {tenant_id} has the domain {name} already")
            stored = await tx.run(store.one(tenant_id, name))
        assert stored is not None
        return view(stored, self.spf)

    async def listing(self, tenant: str | None = None) -> list[DomainView]:
        async with self.db.connect(read_only=True) as session:
            tenant_id = await session.run(tenant_id_of(tenant)) if tenant is not None else None
            found = await session.run(store.listing(tenant_id))
        return [view(d, self.spf) for d in found]

    async def show(self, tenant: str, domain: str) -> DomainView:
        async with self.db.connect(read_only=True) as session:
            return view(await self._one(session, tenant, domain), self.spf)

    async def check(self, tenant: str, domain: str, *, now: datetime) -> DomainView:
        """Ask DNS now, keep what it found, and answer the domain with its findings."""
        async with self.db.connect(read_only=True) as session:
            stored = await self._one(session, tenant, domain)
        return await self._checked(stored, now)

    async def check_due(self, *, now: datetime, every: timedelta) -> int:
        """Re-check the domains last checked more than `every` ago (the scheduler's job);
        how many were checked. Logs each one whose readiness changed."""
        async with self.db.connect(read_only=True) as session:
            due = await session.run(store.due(now - every, CHECK_BATCH))
            found = [await session.run(store.one(t, d)) for t, d in due]
        for stored in (d for d in found if d is not None):
            checked = await self._checked(stored, now)
            if checked.ready is not stored.ready and stored.ready is not None:
                log.get("mailbag.domains").warning(
                    "sender_domain_readiness_changed",
                    tenant=stored.tenant_id,
                    domain=stored.domain,
                    ready=checked.ready,
                )
        return len(due)

    async def remove(self, tenant: str, domain: str, *, selector: str | None = None) -> str:
        """Remove a domain with its keys, or only one key that does not sign."""
        name = dkim.sender_domain(domain)
        async with self.db.transaction() as tx:
            tenant_id = await tx.run(tenant_id_of(tenant))
            if selector is None:
                if not await tx.run(store.remove(tenant_id, name)):
                    raise UnknownDomain(f"tenant {tenant_id} has no domain {name}")
                return tenant_id
            chosen = dkim.selector(selector)
            stored = await self._one(tx, tenant_id, name)
            signing = stored.signing
            if signing is not None and signing.selector == chosen:
                raise RotationRefused(
                    f"{chosen} signs {name}'s mail: rotate to another key first "
                    f"(`mailbag domains rotate {tenant_id} {name}`), or remove the domain"
                )
            if not await tx.run(store.remove_key(tenant_id, name, chosen)):
                raise UnknownDomain(f"{name} has no key with the selector {chosen}")
            return tenant_id

    async def rotate(
        self,
        tenant: str,
        domain: str,
        *,
        now: datetime,
        selector: str | None = None,
        algorithm: str | None = None,
        key_file: bytes | None = None,
    ) -> DomainView:
        """A rotation's first step: a new key, `next`, to publish beside the signing one,
        which goes on signing until `finish_rotation`."""
        name = dkim.sender_domain(domain)
        chosen = dkim.selector(selector) if selector is not None else None
        async with self.db.transaction() as tx:
            stored = await self._one(tx, tenant, name)
            if any(k.state is KeyState.NEXT for k in stored.keys):
                raise RotationRefused(
                    f"{name} has a next key already: finish that rotation "
                    f"(`mailbag domains rotate {stored.tenant_id} {name} --finish`) first"
                )
            taken = [k.selector for k in stored.keys]
            chosen = chosen or default_selector(now, taken)
            if chosen in taken:
                raise DomainExists(f"{name} has a key with the selector {chosen} already")
            signing = stored.signing
            kind = algorithm or (signing.algorithm if signing else "rsa")
            pair = dkim.imported(key_file) if key_file is not None else None
            key = self._new_key(pair or dkim.generate(algorithm_of(kind)), chosen)
            await tx.run(store.add_key(stored.tenant_id, name, key, now=now))
            stored = await self._one(tx, stored.tenant_id, name)
        return view(stored, self.spf)

    async def finish_rotation(self, tenant: str, domain: str, *, now: datetime) -> DomainView:
        """A rotation's last step, once DNS publishes the next key: it signs from now, and
        the one that signed is retired (still published: remove it with `--selector` once
        the mail it signed is delivered)."""
        async with self.db.connect(read_only=True) as session:
            stored = await self._one(session, tenant, domain)
        following = next((k for k in stored.keys if k.state is KeyState.NEXT), None)
        if following is None:
            raise RotationRefused(
                f"{stored.domain} has no next key: start a rotation with "
                f"`mailbag domains rotate {stored.tenant_id} {stored.domain}`"
            )
        _, findings = await judge_all(replace(stored, keys=(following,)), self.spf, self.resolver)
        finding = next(f for f in findings if f.record.selector == following.selector)
        if finding.state is not rules.State.OK:
            raise RotationRefused(
                f"the next key's record ({finding.record.name}) is {finding.state.value}: "
                f"{finding.fix}"
            )
        async with self.db.transaction() as tx:
            await tx.run(store.promote(stored.tenant_id, stored.domain, following.selector))
        async with self.db.connect(read_only=True) as session:
            stored = await self._one(session, stored.tenant_id, stored.domain)
        return await self._checked(stored, now)

    async def _checked(self, stored: StoredDomain, now: datetime) -> DomainView:
        ready, findings = await judge_all(stored, self.spf, self.resolver)
        report = [f.as_dict() for f in findings]
        async with self.db.transaction() as tx:
            await tx.run(
                store.record_check(
                    stored.tenant_id, stored.domain, ready=ready, report=report, now=now
                )
            )
        since = stored.ready_since if stored.ready is ready else now
        checked = replace(stored, ready=ready, checked_at=now, ready_since=since, report=report)
        return view(checked, self.spf)

    async def _one(self, session: AsyncSession, tenant: str, domain: str) -> StoredDomain:
        name = dkim.sender_domain(domain)
        tenant_id = await session.run(tenant_id_of(tenant))
        stored = await session.run(store.one(tenant_id, name))
        if stored is None:
            raise UnknownDomain(f"tenant {tenant_id} has no domain {name}")
        return stored


async def signing_keys(
    source: AsyncEngine | AsyncSession, box: SecretBox
) -> Mapping[tuple[str, str], SigningKey]:
    """Every domain's signing key, opened (see `opened_keys`)."""
    if isinstance(source, AsyncSession):
        return await source.run(opened_keys(box))
    async with AsyncDatabase(source).connect(read_only=True) as session:
        return await session.run(opened_keys(box))
