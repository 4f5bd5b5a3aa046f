"""Tenants: create one (its API key is shown once), and authenticate a key."""

from __future__ import annotations

import hmac
import secrets

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from mailbag.clock import utcnow
from mailbag.domain.verification import digest
from mailbag.store import tenants as store
from mailbag.store.plan import run, run_async
from mailbag.store.tenants import Tenant

KEY_PREFIX = "mb_"


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def create_tenant(conn: Connection, name: str) -> tuple[Tenant, str]:
    """A new tenant and its API key. Only the key's digest is stored: this is the one time
    anyone sees the key."""
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


async def authenticate(conn: AsyncConnection, key: str) -> Tenant | None:
    if not key.startswith(KEY_PREFIX) or len(key) > 200:
        return None
    key_digest = digest(key)
    tenant = await run_async(conn, store.by_key_digest(key_digest))
    # The lookup is by the digest of a 256-bit random key, so its timing reveals nothing
    # useful; the compare is constant-time anyway.
    if tenant is None or not hmac.compare_digest(digest(key), key_digest):
        return None
    return tenant
