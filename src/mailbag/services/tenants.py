"""Tenants: create one (its API key is shown once), list them, and authenticate a key."""

from __future__ import annotations

import secrets

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from mailbag.clock import utcnow
from mailbag.domain.verification import digest
from mailbag.store import tenants as store
from mailbag.store.plan import run, run_async
from mailbag.store.tenants import Tenant

KEY_PREFIX = "mb_"


class NameTaken(Exception):
    """A tenant of that name exists already; nothing was created."""


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def create_tenant(conn: Connection, name: str) -> tuple[Tenant, str]:
    """A new tenant and its API key. Only the key's digest is stored: this is the one time
    anyone sees the key."""
    if run(conn, store.by_name(name)) is not None:
        raise NameTaken(f"a tenant named {name!r} exists already")
    key = new_api_key()
    tenant = run(
        conn,
        store.create(
            tenant_id=f"t_{secrets.token_hex(8)}",
            name=name,
            key_digest=digest(key),
            key_prefix=key[: len(KEY_PREFIX) + 6],
            now=utcnow(),
        ),
    )
    return tenant, key


def all_tenants(conn: Connection) -> list[Tenant]:
    """Every tenant, oldest first (key prefixes only: the keys themselves are not kept)."""
    return run(conn, store.all_tenants())


async def authenticate(conn: AsyncConnection, key: str) -> Tenant | None:
    """The tenant whose key this is. Found by the key's digest: a digest of a 256-bit random
    key, so the lookup's timing tells a guesser nothing useful."""
    if not key.startswith(KEY_PREFIX) or len(key) > 200:
        return None
    return await run_async(conn, store.by_key_digest(digest(key)))
