"""`/v1/messages`: send, read, list, cancel."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from mailbag.api.deps import KeyDep, NowDep, ServicesDep, TenantDep
from mailbag.api.problems import COMMON, documented
from mailbag.api.replay import replayed
from mailbag.api.schemas import MessageCreate, MessageOut, MessagePage
from mailbag.compose import check_renders
from mailbag.domain.message import ANY_ADDRESS, InvalidMessage, new_message, normalize_address
from mailbag.domain.states import Status

router = APIRouter(prefix="/v1/messages", tags=["messages"])


@router.post("", status_code=201, response_model=MessageOut, responses=documented(*COMMON, 409))
async def create_message(
    body: MessageCreate,
    svc: ServicesDep,
    tenant: TenantDep,
    key: KeyDep,
    now: NowDep,
    response: Response,
) -> Any:
    """Put an email into the outbox. With an Idempotency-Key, retries are safe: the same key
    and body replay the first answer (header `Idempotent-Replayed: true`); the same key with
    a different body is a 409."""
    message = new_message(
        to=body.to,
        to_name=body.to_name,
        template=body.template,
        data=body.data,
        subject=body.subject,
        send_at=body.send_at,
        tags=body.tags,
        metadata=body.metadata,
        headers=body.headers,
        tenant_id=tenant.id,
        idempotency_key=key,
        known_templates=svc.catalog_names,
        address_rules=svc.settings.address_rules,
    )
    check_renders(message, svc.catalog)
    result = await svc.messages.create(key=key, message=message, now=now)
    return replayed(result, response, "POST /v1/messages")


@router.get(
    "/{message_id}",
    response_model=MessageOut,
    response_model_by_alias=True,
    responses=documented(*COMMON, 404),
)
async def get_message(message_id: uuid.UUID, svc: ServicesDep, tenant: TenantDep) -> Any:
    """The message and its full event history."""
    return await svc.messages.get(tenant_id=tenant.id, message_id=message_id)


@router.get("", response_model=MessagePage, responses=documented(*COMMON))
async def list_messages(
    svc: ServicesDep,
    tenant: TenantDep,
    status: Status | None = None,
    to: Annotated[str | None, Query(max_length=255)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    cursor: Annotated[str | None, Query(max_length=100)] = None,
) -> Any:
    """Newest first; pass `next_cursor` back as `cursor` for the next page."""
    try:
        recipient = normalize_address(to, ANY_ADDRESS) if to else None
    except ValueError as exc:
        raise InvalidMessage({"to": f"is not a valid email address: {exc}"}) from None
    return await svc.messages.list(
        tenant_id=tenant.id, status=status, to=recipient, limit=limit, cursor=cursor
    )


@router.post(
    "/{message_id}/cancel", response_model=MessageOut, responses=documented(*COMMON, 404, 409)
)
async def cancel_message(
    message_id: uuid.UUID, svc: ServicesDep, tenant: TenantDep, key: KeyDep, now: NowDep
) -> Any:
    """Withdraw a pending message (409 once a worker has taken it)."""
    return await svc.messages.cancel(tenant_id=tenant.id, message_id=message_id, now=now)
