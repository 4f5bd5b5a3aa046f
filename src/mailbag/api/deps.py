"""Request dependencies: the services, the clock, and the tenant behind the API key."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

import structlog
from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from mailbag import web
from mailbag.api.problems import ProblemError, unauthorized
from mailbag.services import tenants
from mailbag.services.container import Services
from mailbag.services.idempotency import InvalidIdempotencyKey, check_key, key_hash
from mailbag.store.tenants import Tenant


async def services(request: Request) -> Services:
    return web.services(request)  # async: FastAPI would run a plain function in a thread


async def now(svc: Annotated[Services, Depends(services)]) -> datetime:
    return svc.clock()


bearer = HTTPBearer(auto_error=False, description="The tenant's API key.")


async def tenant(
    svc: Annotated[Services, Depends(services)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Tenant:
    found = await tenant_behind(svc, credentials)
    structlog.contextvars.bind_contextvars(tenant=found.id)
    return found


async def tenant_behind(svc: Services, credentials: HTTPAuthorizationCredentials | None) -> Tenant:
    """The tenant whose API key the credentials carry, else a 401. The routes ask here, and
    so does BodyLimit before it reads a large body (api/intake_limits.py)."""
    refused = unauthorized(
        "send `Authorization: Bearer <API key>` with a valid key", 'Bearer realm="mailbag"'
    )
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise refused
    key = credentials.credentials
    found = svc.known_keys.get(key)
    if found is None:
        found = await tenants.authenticate(svc.engine, key)
        if found is None:
            raise refused
        svc.known_keys.put(key, found)
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


@dataclass(frozen=True)
class Call:
    """What a tenant's request works with: the services, the tenant behind its key, the
    time it came, and its Idempotency-Key (None: it gave none)."""

    svc: Services
    tenant: Tenant
    now: datetime
    key: str | None


@dataclass(frozen=True)
class KeyedCall(Call):
    """A call that must carry an Idempotency-Key (400 otherwise)."""

    key: str


async def call(
    svc: Annotated[Services, Depends(services)],
    tenant_: Annotated[Tenant, Depends(tenant)],
    when: Annotated[datetime, Depends(now)],
    key: Annotated[str | None, Depends(idempotency_key)],
) -> Call:
    return Call(svc, tenant_, when, key)


async def keyed_call(
    svc: Annotated[Services, Depends(services)],
    tenant_: Annotated[Tenant, Depends(tenant)],
    when: Annotated[datetime, Depends(now)],
    key: Annotated[str, Depends(required_idempotency_key)],
) -> KeyedCall:
    return KeyedCall(svc, tenant_, when, key)


ServicesDep = Annotated[Services, Depends(services)]
TenantDep = Annotated[Tenant, Depends(tenant)]
NowDep = Annotated[datetime, Depends(now)]
KeyDep = Annotated[str | None, Depends(idempotency_key)]
RequiredKeyDep = Annotated[str, Depends(required_idempotency_key)]
CallDep = Annotated[Call, Depends(call)]
KeyedCallDep = Annotated[KeyedCall, Depends(keyed_call)]
