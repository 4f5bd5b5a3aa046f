"""Request dependencies: the services, the clock, and the tenant behind the API key."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated

import structlog
from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag.api.problems import ProblemError
from mailbag.api.throttle import FailureThrottle
from mailbag.clock import Clock
from mailbag.keys import secret_matches as secret_matches  # one door, shared with the worker
from mailbag.services import tenants
from mailbag.services.idempotency import InvalidIdempotencyKey, check_key, key_hash
from mailbag.services.messages import Messages
from mailbag.services.operations import Operations
from mailbag.services.verification import Verifications
from mailbag.settings import Settings
from mailbag.store.tenants import Tenant
from mailbag.templates import Catalog


class KeyCache:
    """Tenants of recently seen API keys, for a short while: a busy client's requests need
    not each look its key up. Keys are never revoked in place (a tenant gets a new one),
    so the cost of the cache is at most TTL seconds of a deleted tenant's key working."""

    TTL = 30.0
    SIZE = 10_000

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, Tenant]] = {}

    def get(self, key: str) -> Tenant | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def put(self, key: str, tenant: Tenant) -> None:
        if len(self._entries) >= self.SIZE:
            self._entries.clear()
        self._entries[key] = (time.monotonic() + self.TTL, tenant)


@dataclass
class Services:
    settings: Settings
    engine: AsyncEngine
    clock: Clock
    messages: Messages
    verifications: Verifications
    operations: Operations
    catalog: Catalog
    known_keys: KeyCache = field(default_factory=lambda: KeyCache())
    # Wrong console passwords and wrong admin tokens, each limited on its own.
    login_failures: FailureThrottle = field(init=False)
    admin_token_failures: FailureThrottle = field(init=False)

    def __post_init__(self) -> None:
        self.login_failures = self._failure_throttle()
        self.admin_token_failures = self._failure_throttle()

    def _failure_throttle(self) -> FailureThrottle:
        return FailureThrottle(
            per_client=self.settings.auth_failures_per_client,
            overall=self.settings.auth_failures_overall,
        )

    @property
    def catalog_names(self) -> frozenset[str]:
        return self.catalog.names()


async def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


async def now(svc: Annotated[Services, Depends(services)]) -> datetime:
    return svc.clock()


def client_address(request: Request) -> str:
    """Who is asking, for throttling: the peer address. Behind a reverse proxy, tell
    uvicorn to trust it (FORWARDED_ALLOW_IPS=<proxy address>) so this is the client's
    address from X-Forwarded-For, not the proxy's (which would share one limit)."""
    return request.client.host if request.client else "unknown"


def too_many_attempts(retry_after: int) -> ProblemError:
    return ProblemError(
        429,
        "too-many-attempts",
        "Too many failed attempts",
        f"too many wrong credentials; try again in {retry_after} s",
        headers={"Retry-After": str(retry_after)},
    )


bearer = HTTPBearer(auto_error=False, description="The tenant's API key.")


async def tenant(
    svc: Annotated[Services, Depends(services)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Tenant:
    unauthorized = ProblemError(
        401,
        "unauthorized",
        "Unauthorized",
        "send `Authorization: Bearer <API key>` with a valid key",
        headers={"WWW-Authenticate": 'Bearer realm="mailbag"'},
    )
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise unauthorized
    key = credentials.credentials
    found = svc.known_keys.get(key)
    if found is None:
        async with svc.engine.connect() as conn:
            found = await tenants.authenticate(conn, key)
        if found is None:
            raise unauthorized
        svc.known_keys.put(key, found)
    structlog.contextvars.bind_contextvars(tenant=found.id)
    return found


async def idempotency_key(
    key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="1 to 255 printable ASCII characters; "
            "the same key and request give the same answer.",
        ),
    ] = None,
) -> str | None:
    try:
        checked = check_key(key)
    except InvalidIdempotencyKey as exc:
        raise ProblemError(
            400, "invalid-idempotency-key", "Invalid Idempotency-Key", str(exc)
        ) from None
    if checked is not None:
        structlog.contextvars.bind_contextvars(idempotency_key_hash=key_hash(checked))
    return checked


async def required_idempotency_key(
    key: Annotated[str | None, Depends(idempotency_key)],
) -> str:
    if key is None:
        raise ProblemError(
            400,
            "idempotency-key-required",
            "Idempotency-Key required",
            "this operation needs an Idempotency-Key header",
        )
    return key


ServicesDep = Annotated[Services, Depends(services)]
TenantDep = Annotated[Tenant, Depends(tenant)]
NowDep = Annotated[datetime, Depends(now)]
KeyDep = Annotated[str | None, Depends(idempotency_key)]
RequiredKeyDep = Annotated[str, Depends(required_idempotency_key)]
