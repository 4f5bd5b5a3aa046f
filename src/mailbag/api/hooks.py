"""`/v1/admin/tenants/{tenant}/hooks/...`: a tenant's event hook endpoints, their signing
secrets and their deliveries, for operators (`Authorization: Bearer <ADMIN_TOKEN>`).

`{tenant}` is a tenant's id or its name. A secret (`whsec_...`) appears in two answers
only: the endpoint's creation and a rotation; it is stored sealed with HOOKS_KEY and never
listed, shown or logged again.

Errors, as problem+json:
    404 not-found        no such tenant, endpoint or delivery (or one of another tenant)
    404 hooks-off        HOOKS_KEY is unset: hooks are off, every route here says so
                         (after the admin token was checked: a stranger learns nothing)
    409 not-replayable   a replay of a delivery that is still on its way
    422 invalid-hook     a URL or event list the rules refuse (`errors` says which field)
    400 invalid-cursor   a cursor this API did not give out
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mailbag import log
from mailbag.api.admin import admin
from mailbag.api.deps import ServicesDep
from mailbag.api.problems import COMMON, ProblemError, documented
from mailbag.api.schemas import Strict
from mailbag.domain.hooks import (
    CLAIMABLE_DELIVERIES,
    DESCRIPTION_MAX,
    DState,
    HookEvent,
    InvalidHook,
    parse_events,
)
from mailbag.domain.hooks.urls import URL_MAX
from mailbag.domain.message import TENANT_ID_MAX
from mailbag.services import hooks as hook_service
from mailbag.services.hooks import DeliveryFilter, Hooks, HooksOff, NewSecret
from mailbag.services.tenants import resolve_async

ACTOR = "operator:api"  # the actor of the history row a replay writes


async def hooks(svc: ServicesDep) -> Hooks:
    """The service, if hooks are on: checked once here so that a route's body is never
    validated (a 422) for a feature that is off."""
    if not svc.hooks.enabled:
        raise HooksOff()
    return svc.hooks


HooksDep = Annotated[Hooks, Depends(hooks)]


async def tenant_id(
    tenant: Annotated[str, Path(max_length=TENANT_ID_MAX, description="A tenant's id or name.")],
    svc: ServicesDep,
    _: HooksDep,  # first: with hooks off, no tenant is looked up
) -> str:
    """The id of the tenant the path names (by id or name); UnknownTenant (404) if none."""
    return await resolve_async(svc.engine, tenant)


TenantPath = Annotated[str, Depends(tenant_id)]

router = APIRouter(
    prefix="/v1/admin/tenants/{tenant}/hooks",
    tags=["event hooks"],
    dependencies=[Depends(admin)],  # the admin token first: hooks-off tells strangers nothing
)
RESPONSES = documented(*COMMON, 404, 429)
ACTION_RESPONSES = documented(*COMMON, 404, 409, 429)


# --- bodies ----------------------------------------------------------------------------

EVENTS_HELP = (
    "Events to receive: `message.sent` or just `sent`; `*` for all of them. Known: "
    + ", ".join(e.value for e in HookEvent)
    + "."
)


class EndpointIn(Strict):
    url: str = Field(
        max_length=URL_MAX,
        description="Where the signed POSTs go: an https:// URL.",
        examples=["https://hooks.acme.example/mailbag"],
    )
    events: list[str] = Field(min_length=1, max_length=len(HookEvent) + 1, description=EVENTS_HELP)
    description: str | None = Field(
        None, max_length=DESCRIPTION_MAX, description="A note for operators."
    )
    enabled: bool = Field(True, description="False: created, but nothing is sent to it yet.")

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "url": "https://hooks.acme.example/mailbag",
                    "events": ["sent", "bounced", "complained"],
                    "description": "billing service",
                }
            ]
        }
    )


class EndpointChange(Strict):
    """What to change; a field left out (or null) stays as it is."""

    url: str | None = Field(None, max_length=URL_MAX, description="A new https:// URL.")
    events: list[str] | None = Field(
        None, min_length=1, max_length=len(HookEvent) + 1, description=EVENTS_HELP
    )
    enabled: bool | None = Field(
        None,
        description="False stops deliveries to it (they wait, and go out once it is "
        "enabled again).",
    )
    description: str | None = Field(
        None, max_length=DESCRIPTION_MAX, description='A new note; "" removes it.'
    )

    model_config = ConfigDict(json_schema_extra={"examples": [{"enabled": False}]})


EXAMPLE_ENDPOINT: dict[str, Any] = {
    "id": "0b4f5f8e-6a1c-4c39-9d7e-3f3f8c2f1a10",
    "tenant_id": "t_5f1c2a9b0e3d4c7a",
    "url": "https://hooks.acme.example/mailbag",
    "events": ["message.bounced", "message.complained", "message.sent"],
    "enabled": True,
    "description": "billing service",
    "created_at": "2026-11-30T22:00:00Z",
    "updated_at": "2026-11-30T22:00:00Z",
}


class EndpointOut(BaseModel):
    """An endpoint, never with its secret."""

    id: uuid.UUID
    tenant_id: str
    url: str
    events: list[HookEvent] = Field(description="Subscribed events, sorted.")
    enabled: bool
    description: str | None
    created_at: datetime
    updated_at: datetime

    # Read from the service's HookEndpoint by attribute: each field is named once.
    model_config = ConfigDict(
        from_attributes=True, json_schema_extra={"examples": [EXAMPLE_ENDPOINT]}
    )

    @field_validator("events", mode="before")
    @classmethod
    def _sorted(cls, events: Any) -> Any:
        return sorted(events) if isinstance(events, (set, frozenset)) else events


class EndpointWithSecret(EndpointOut):
    """An endpoint and its signing secret: the only answers that ever show it."""

    secret: str = Field(
        description="The signing secret, `whsec_<base64>`: shown this once and stored "
        "only encrypted. Verify each POST's `webhook-signature` with it (Standard Webhooks)."
    )

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{**EXAMPLE_ENDPOINT, "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}]
        }
    )

    @classmethod
    def of_new(cls, new: NewSecret) -> EndpointWithSecret:
        return cls(**EndpointOut.model_validate(new.endpoint).model_dump(), secret=new.secret)


class Removed(BaseModel):
    removed: bool


EXAMPLE_DELIVERY: dict[str, Any] = {
    "id": "5a3e9c1d-2b7f-4e08-a1c4-7d9e2f6b8a01",
    "endpoint_id": EXAMPLE_ENDPOINT["id"],
    "tenant_id": EXAMPLE_ENDPOINT["tenant_id"],
    "url": EXAMPLE_ENDPOINT["url"],
    "event": "message.bounced",
    "message_id": "9c1f7a52-3d4e-4b6a-8f0e-1a2b3c4d5e6f",
    "webhook_id": "msg_2b7f4e08a1c47d9e2f6b8a015a3e9c1d",
    "status": "retrying",
    "attempts": 2,
    "max_attempts": 8,
    "next_attempt_at": "2026-11-30T22:04:10Z",
    "last_status_code": 503,
    "last_error": "HTTP 503",
    "created_at": "2026-11-30T22:03:00Z",
    "updated_at": "2026-11-30T22:03:20Z",
    "delivered_at": None,
}


class DeliveryOut(BaseModel):
    """One event on its way to one endpoint."""

    id: uuid.UUID
    endpoint_id: uuid.UUID
    tenant_id: str
    url: str | None = Field(None, description="The endpoint's URL (null: it was removed).")
    event: HookEvent
    message_id: uuid.UUID
    webhook_id: str = Field(
        description="The `webhook-id` header: the same on every retry and replay; "
        "receivers deduplicate by it."
    )
    status: DState
    attempts: int
    max_attempts: int
    next_attempt_at: datetime | None = Field(
        description="When a worker tries next (pending, retrying); null otherwise."
    )
    last_status_code: int | None = Field(description="The endpoint's last HTTP status.")
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    delivered_at: datetime | None

    model_config = ConfigDict(
        from_attributes=True, json_schema_extra={"examples": [EXAMPLE_DELIVERY]}
    )

    @model_validator(mode="after")
    def _no_next_attempt_when_settled(self) -> DeliveryOut:
        if self.status not in CLAIMABLE_DELIVERIES:  # the stored time is a leftover, not a plan
            self.next_attempt_at = None
        return self


class HistoryOut(BaseModel):
    """One move of a delivery: an attempt's outcome, a lease that ran out, a replay."""

    at: datetime
    from_status: DState | None
    to_status: DState
    actor: str = Field(description="`worker:...`, or the operator who replayed it.")
    attempt: int
    status_code: int | None
    detail: str | None

    model_config = ConfigDict(from_attributes=True)


class DeliveryDetailOut(DeliveryOut):
    payload: dict[str, Any] = Field(
        description="The JSON body every attempt POSTs: `type`, `timestamp`, `data`."
    )
    history: list[HistoryOut] = Field(description="Oldest first.")

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    **EXAMPLE_DELIVERY,
                    "payload": {
                        "type": "message.bounced",
                        "timestamp": "2026-11-30T22:03:00Z",
                        "data": {
                            "message_id": EXAMPLE_DELIVERY["message_id"],
                            "status": "sent",
                            "bounce_type": "hard",
                        },
                    },
                    "history": [
                        {
                            "at": "2026-11-30T22:03:10Z",
                            "from_status": "processing",
                            "to_status": "retrying",
                            "actor": "worker:host-1",
                            "attempt": 1,
                            "status_code": 503,
                            "detail": "HTTP 503",
                        }
                    ],
                }
            ]
        }
    )


class DeliveryPageOut(BaseModel):
    items: list[DeliveryOut] = Field(description="Newest first.")
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next (older) page; null on the last page."
    )


# --- endpoints -------------------------------------------------------------------------


@router.post("/endpoints", status_code=201, response_model=EndpointWithSecret, responses=RESPONSES)
async def create_endpoint(tenant: TenantPath, body: EndpointIn, hooks: HooksDep) -> Any:
    """Subscribe a URL to a tenant's message events. The answer holds the signing secret:
    keep it, it is never shown again (rotate it to get a new one)."""
    new = await hooks.create_endpoint(
        tenant, body.url, body.events, body.description, enabled=body.enabled
    )
    log.get("mailbag.api").info(
        "hook_endpoint_created", endpoint=str(new.endpoint.id), tenant=new.endpoint.tenant_id
    )
    return EndpointWithSecret.of_new(new)


@router.get("/endpoints", response_model=list[EndpointOut], responses=RESPONSES)
async def list_endpoints(tenant: TenantPath, hooks: HooksDep) -> Any:
    """A tenant's endpoints, oldest first (never their secrets)."""
    return [EndpointOut.model_validate(e) for e in await hooks.list_endpoints(tenant)]


@router.get("/endpoints/{endpoint_id}", response_model=EndpointOut, responses=RESPONSES)
async def get_endpoint(tenant: TenantPath, endpoint_id: uuid.UUID, hooks: HooksDep) -> Any:
    return EndpointOut.model_validate(await hooks.get_endpoint(endpoint_id, tenant))


@router.patch("/endpoints/{endpoint_id}", response_model=EndpointOut, responses=RESPONSES)
async def update_endpoint(
    tenant: TenantPath, endpoint_id: uuid.UUID, body: EndpointChange, hooks: HooksDep
) -> Any:
    """Change an endpoint's URL, events, description, or turn it off and on."""
    changed = await hooks.update_endpoint(
        endpoint_id,
        tenant_id=tenant,
        url=body.url,
        events=body.events,
        enabled=body.enabled,
        description=body.description,
    )
    return EndpointOut.model_validate(changed)


@router.post(
    "/endpoints/{endpoint_id}/rotate-secret",
    response_model=EndpointWithSecret,
    responses=RESPONSES,
)
async def rotate_secret(tenant: TenantPath, endpoint_id: uuid.UUID, hooks: HooksDep) -> Any:
    """A new signing secret, shown this once; every later attempt is signed with it
    (the old one stops working at once)."""
    new = await hooks.rotate_secret(endpoint_id, tenant)
    log.get("mailbag.api").info(
        "hook_secret_rotated", endpoint=str(endpoint_id), tenant=new.endpoint.tenant_id
    )
    return EndpointWithSecret.of_new(new)


@router.delete("/endpoints/{endpoint_id}", response_model=Removed, responses=RESPONSES)
async def delete_endpoint(tenant: TenantPath, endpoint_id: uuid.UUID, hooks: HooksDep) -> Any:
    """Remove an endpoint, with its deliveries and their history."""
    await hooks.delete_endpoint(endpoint_id, tenant)
    log.get("mailbag.api").info("hook_endpoint_removed", endpoint=str(endpoint_id))
    return Removed(removed=True)


# --- deliveries ------------------------------------------------------------------------


def _event(name: str | None) -> HookEvent | None:
    if name is None:
        return None
    chosen = parse_events([name])
    if len(chosen) != 1:
        raise InvalidHook({"event": "name one event to filter by"})
    return next(iter(chosen))


@router.get("/deliveries", response_model=DeliveryPageOut, responses=RESPONSES)
async def list_deliveries(
    tenant: TenantPath,
    hooks: HooksDep,
    status: DState | None = None,
    endpoint_id: uuid.UUID | None = None,
    event: Annotated[
        str | None, Query(max_length=30, description="`message.bounced` or `bounced`.")
    ] = None,
    message_id: uuid.UUID | None = None,
    limit: Annotated[int, Query(ge=1, le=hook_service.PAGE_MAX)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Any:
    """A tenant's deliveries, newest first, filtered; page with `next_cursor`."""
    where = DeliveryFilter(
        tenant_id=tenant,
        endpoint_id=endpoint_id,
        status=status,
        event=_event(event),
        message_id=message_id,
    )
    try:
        page = await hooks.list_deliveries(where, cursor=cursor, limit=limit)
    except ValueError as exc:  # the service's word for a cursor it did not give out
        raise ProblemError(400, "invalid-cursor", "Invalid cursor", str(exc)) from None
    return DeliveryPageOut(
        items=[DeliveryOut.model_validate(d) for d in page.deliveries], next_cursor=page.next_cursor
    )


@router.get("/deliveries/{delivery_id}", response_model=DeliveryDetailOut, responses=RESPONSES)
async def get_delivery(tenant: TenantPath, delivery_id: uuid.UUID, hooks: HooksDep) -> Any:
    """A delivery with the body it POSTs and its history: every attempt's HTTP status or
    error, leases that ran out, replays."""
    found = await hooks.get_delivery(delivery_id, tenant)
    return DeliveryDetailOut(
        **DeliveryOut.model_validate(found.delivery).model_dump(),
        payload=json.loads(found.delivery.payload),
        history=found.history,
    )


@router.post(
    "/deliveries/{delivery_id}/replay",
    status_code=202,
    response_model=DeliveryOut,
    responses=ACTION_RESPONSES,
)
async def replay(tenant: TenantPath, delivery_id: uuid.UUID, hooks: HooksDep) -> Any:
    """Send a delivered or dead delivery again: the same body and `webhook-id`, a fresh
    attempt budget. Accepted: a worker POSTs it soon (409 while it is still on its way)."""
    again = await hooks.replay(delivery_id, actor=ACTOR, tenant_id=tenant)
    log.get("mailbag.api").info("hook_delivery_replayed", delivery=str(delivery_id), actor=ACTOR)
    return DeliveryOut.model_validate(again)
