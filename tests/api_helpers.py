"""Running the real app in-process (httpx ASGI transport) against a test database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from mailbag.api import create_app
from mailbag.clock import Clock, utcnow
from mailbag.services.tenants import create_tenant
from mailbag.settings import Settings

from conftest import TestDB

# Server databases have no key file beside them: every replica is given the same key.
TEST_SECRET_KEY = "test-secret-key-not-for-production-0123456789"


def settings_for(db: TestDB, **overrides: Any) -> Settings:
    return Settings.model_validate(
        {"database_url": db.url, "log_level": "WARNING", "secret_key": TEST_SECRET_KEY, **overrides}
    )


def new_tenant(db: TestDB, name: str = "acme") -> tuple[str, str]:
    """(tenant id, API key)"""
    tenant, key = create_tenant(db.engine, name)
    return tenant.id, key


@asynccontextmanager
async def api_client(
    db: TestDB, key: str | None = None, *, clock: Clock = utcnow, **overrides: Any
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings_for(db, **overrides), clock=clock)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://mailbag.test", headers=headers
        ) as client:
            yield client
