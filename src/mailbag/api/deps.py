"""Request dependencies: the services, the clock, and the tenant behind the API key."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

import structlog
from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag.api.problems import ProblemError
from mailbag.clock import Clock
from mailbag.services import tenants
from mailbag.services.idempotency import InvalidIdempotencyKey, check_key, key_hash
from mailbag.services.messages import Messages
from mailbag.services.operations import Operations
from mailbag.services.verification import Verifications
from mailbag.settings import Settings
from mailbag.store.tenants import Tenant
from mailbag.templates import Catalog


@dataclass
class Services:
    settings: Settings
    engine: AsyncEngine
    clock: Clock
    messages: Messages
    verifications: Verifications
    operations: Operations
    catalog: Catalog

    @property
    def catalog_names(self) -> frozenset[str]:
        return self.catalog.names()


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


def now(svc: Annotated[Services, Depends(services)]) -> datetime:
    return svc.clock()


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
    async with svc.engine.connect() as conn:
        found = await tenants.authenticate(conn, credentials.credentials)
    if found is None:
        raise unauthorized
    structlog.contextvars.bind_contextvars(tenant=found.id)
    return found


def idempotency_key(
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


def required_idempotency_key(
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
