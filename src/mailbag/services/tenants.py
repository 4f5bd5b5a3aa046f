"""Tenants: create one (its API key is shown once), list them, authenticate a key, and the
sender identities each may send from.

A person names a tenant by its id (`t_5f1c...`) or by its name (`acme`), wherever they
name one: every option and argument of the command line, every path, query and body field
of the admin API, the console's filters and forms. Each of those resolves it through
`tenant_id_of` (run by `resolve` or `resolve_async`), so an unknown tenant is refused
(UnknownTenant: exit 2, HTTP 404) before anything is written, never stored as a tenant id
nobody has.
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime
from typing import TYPE_CHECKING, overload

from email_validator import EmailNotValidError

from mailbag.clock import utcnow
from mailbag.domain.message import (
    ANY_ADDRESS,
    DEFAULT_TENANT,
    NAME_MAX,
    InvalidMessage,
    normalize_address,
    unsafe_text,
)
from mailbag.domain.verification import digest
from mailbag.store import senders as sender_store
from mailbag.store import tenants as store
from mailbag.store.plan import Plan
from mailbag.store.senders import SenderIdentity
from mailbag.store.session import AsyncDatabase, Database
from mailbag.store.tenants import Tenant

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

KEY_PREFIX = "mb_"
TENANT_ID = re.compile(r"^t_[0-9a-f]{16}$")  # the ids create_tenant makes


class NameTaken(Exception):
    """A tenant of that name exists already; nothing was created."""


class UnknownTenant(LookupError):
    """No tenant has that id or name."""

    def __init__(self, tenant: str) -> None:
        super().__init__(f"no tenant {tenant!r} (give its id or name; see `mailbag tenants list`)")


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def create_tenant(engine: Engine, name: str) -> tuple[Tenant, str]:
    """A new tenant and its API key. Only the key's digest is stored: this is the one time
    anyone sees the key."""
    if name == DEFAULT_TENANT or TENANT_ID.match(name):  # a name must name one tenant only
        raise NameTaken(f"{name!r} names a tenant by id already; choose another name")
    with Database(engine).transaction() as tx:
        if tx.run(store.by_name(name)) is not None:
            raise NameTaken(f"a tenant named {name!r} exists already")
        key = new_api_key()
        tenant = tx.run(
            store.create(
                tenant_id=f"t_{secrets.token_hex(8)}",
                name=name,
                key_digest=digest(key),
                key_prefix=key[: len(KEY_PREFIX) + 6],
                now=utcnow(),
            ),
        )
    return tenant, key


def all_tenants(engine: Engine) -> list[Tenant]:
    """Every tenant, oldest first (key prefixes only: the keys themselves are not kept)."""
    with Database(engine).connect(read_only=True) as session:
        return session.run(store.all_tenants())


async def authenticate(engine: AsyncEngine, key: str) -> Tenant | None:
    """The tenant whose key this is. Found by the key's digest: a digest of a 256-bit random
    key, so the lookup's timing tells a guesser nothing useful."""
    if not key.startswith(KEY_PREFIX) or len(key) > 200:
        return None
    async with AsyncDatabase(engine).connect(read_only=True) as session:
        return await session.run(store.by_key_digest(digest(key)))


def sender_identity(address: str, name: str | None) -> tuple[str, str | None]:
    """The address (normalized) and name of a sender identity; InvalidMessage if either
    could not be a From."""
    errors: dict[str, str] = {}
    try:
        address = normalize_address(address, ANY_ADDRESS)
    except EmailNotValidError as exc:
        errors["address"] = f"is not a valid email address: {exc}"
    if name is not None:
        if not name.strip() or len(name) > NAME_MAX:
            errors["name"] = f"must be 1 to {NAME_MAX} characters"
        elif (problem := unsafe_text(name)) is not None:
            errors["name"] = problem
    if errors:
        raise InvalidMessage(errors)
    return address, name


def tenant_id_of(tenant: str) -> Plan[str]:
    """The id of the tenant named by id or name (an id first: names never look like ids);
    UnknownTenant if none. `default` (the CLI's and the Python API's tenant) always exists."""
    if tenant == DEFAULT_TENANT:
        return tenant
    found = yield from store.named(tenant)
    if not found:
        raise UnknownTenant(tenant)
    return next((t.id for t in found if t.id == tenant), found[0].id)


@overload
def resolve(engine: Engine, tenant: str) -> str: ...
@overload
def resolve(engine: Engine, tenant: None) -> None: ...
def resolve(engine: Engine, tenant: str | None) -> str | None:
    """`tenant_id_of` for the command line; None (no tenant: every tenant) stays None."""
    if tenant is None:
        return None
    with Database(engine).connect(read_only=True) as session:
        return session.run(tenant_id_of(tenant))


@overload
async def resolve_async(engine: AsyncEngine, tenant: str) -> str: ...
@overload
async def resolve_async(engine: AsyncEngine, tenant: None) -> None: ...
async def resolve_async(engine: AsyncEngine, tenant: str | None) -> str | None:
    """`tenant_id_of` for the admin API and the console."""
    if tenant is None:
        return None
    async with AsyncDatabase(engine).connect(read_only=True) as session:
        return await session.run(tenant_id_of(tenant))


async def names(engine: AsyncEngine) -> dict[str, str]:
    """Every tenant's name by its id, for pages that show tenants."""
    async with AsyncDatabase(engine).connect(read_only=True) as session:
        return {t.id: t.name for t in await session.run(store.all_tenants())}


def _add(tenant: str, address: str, name: str | None, now: datetime) -> Plan[tuple[str, bool]]:
    address, name = sender_identity(address, name)
    tenant_id = yield from tenant_id_of(tenant)
    return tenant_id, (yield from sender_store.add(tenant_id, address, name, now))


def _remove(tenant: str, address: str) -> Plan[bool]:
    tenant_id = yield from tenant_id_of(tenant)
    return (yield from sender_store.remove(tenant_id, address))


def _listing(tenant: str) -> Plan[list[SenderIdentity]]:
    tenant_id = yield from tenant_id_of(tenant)
    return (yield from sender_store.listing(tenant_id))


def add_sender(
    engine: Engine, tenant: str, address: str, name: str | None = None
) -> tuple[str, bool]:
    """Let a tenant (id or name) send from an address: (its id, False if it already could)."""
    with Database(engine).transaction() as tx:
        return tx.run(_add(tenant, address, name, utcnow()))


def remove_sender(engine: Engine, tenant: str, address: str) -> bool:
    with Database(engine).transaction() as tx:
        return tx.run(_remove(tenant, address))


def senders(engine: Engine, tenant: str) -> list[SenderIdentity]:
    with Database(engine).connect(read_only=True) as session:
        return session.run(_listing(tenant))


class Senders:
    """The same, for the admin API."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.db = AsyncDatabase(engine)

    async def add(
        self, tenant: str, address: str, name: str | None, now: datetime
    ) -> tuple[str, bool]:
        async with self.db.transaction() as tx:
            return await tx.run(_add(tenant, address, name, now))

    async def remove(self, tenant: str, address: str) -> bool:
        async with self.db.transaction() as tx:
            return await tx.run(_remove(tenant, address))

    async def listing(self, tenant: str) -> list[SenderIdentity]:
        async with self.db.connect(read_only=True) as session:
            return await session.run(_listing(tenant))
