"""Tenants: create one (its API key is shown once), list them, and authenticate a key."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from mailbag.clock import utcnow
from mailbag.domain.verification import digest
from mailbag.store import tenants as store
from mailbag.store.session import AsyncDatabase, Database
from mailbag.store.tenants import Tenant

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

KEY_PREFIX = "mb_"


class NameTaken(Exception):
    """A tenant of that name exists already; nothing was created."""


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def create_tenant(engine: Engine, name: str) -> tuple[Tenant, str]:
    """A new tenant and its API key. Only the key's digest is stored: this is the one time
    anyone sees the key."""
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
